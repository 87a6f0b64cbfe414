use super::*;

#[tokio::test]
async fn the_demo_fleet_goes_through_ingest_billing_and_attribution() {
    let db = crate::test_support::sqlite();
    let store = db.open().await;
    let card = RateCard::default_card();
    let now = 1_795_300_000_000; // 2026-11-22
    let rules = gpuledger_core::attribution::Rules::default();
    let reports = seed(store.as_ref(), &card, &rules, now).await.unwrap();
    assert!(reports > 500, "{reports}");
    let imports = store::bills::billing_imports(store.db()).await.unwrap();
    assert_eq!(imports.len(), 1);
    // Attribution over the previous month adds up to what the bill says about GPU hosts.
    let (from, to) = gpuledger_core::time::month_of(month_start_ms(month_start_ms(now) - 1));
    let a = crate::attribution::compute(store.as_ref(), &card, &rules, from, to)
        .await
        .unwrap();
    let attributed: Decimal = a.parts.iter().map(|p| p.cost).sum();
    let lines = store::bills::cost_lines(store.db(), from, to)
        .await
        .unwrap();
    let gpu_hosts: Decimal = lines
        .iter()
        .filter(|l| {
            l.resource_key
                .as_deref()
                .is_some_and(|k| k.starts_with("i-"))
        })
        .map(|l| l.effective_cost)
        .sum();
    assert_eq!(attributed, gpu_hosts);
    assert!(
        a.parts.iter().all(|p| !p.estimated),
        "the previous month is fully billed"
    );
    assert!(
        a.unattributed
            .get("USD")
            .is_some_and(|u| *u > Decimal::ZERO),
        "storage counts, unattributed"
    );
    // The month reconciles from the rollups: every billed dollar in one place, to the cent.
    let recs = crate::reconciliation::for_range(store.as_ref(), &card, &rules, from, to)
        .await
        .unwrap();
    assert_eq!(recs.len(), 1);
    let r = &recs[0];
    assert_eq!(r.difference, Decimal::ZERO, "{r:?}");
    assert_eq!(
        r.attributed.total(),
        attributed,
        "the rollups are the ledger"
    );
    assert_eq!(
        r.bill,
        attributed
            + r.not_gpu_total()
            + r.unused_commitments_total()
            + r.gpu_without_agent_unattributed()
    );
    // The savings plan was bought for nine training hosts and eight remain: 88.9 % used, the
    // rest the fleet's, and the training type wholly covered.
    let costs = store::ledger::cost_by_type(store.db(), from, to)
        .await
        .unwrap();
    let c = crate::commitments::for_range(
        store.as_ref(),
        &card,
        &crate::config::Config::default(),
        &costs,
        (from, to),
        now,
    )
    .await
    .unwrap();
    assert_eq!(c.commitments.len(), 1, "{c:?}");
    let plan = &c.commitments[0];
    assert_eq!(plan.id, DEMO_SAVINGS_PLAN);
    assert_eq!(
        plan.utilization_percent.map(|p| p.to_string()),
        Some("88.9".into())
    );
    assert_eq!(plan.unused, plan.used_on_gpus * Decimal::new(125, 3));
    assert_eq!(
        plan.used_on_gpus + plan.unused,
        plan.invoiced,
        "FOCUS 1.2's balance"
    );
    assert_eq!(r.unused_commitments_total(), plan.unused);
    let p4d = c
        .coverage
        .iter()
        .find(|t| t.instance_type == "p4d.24xlarge")
        .unwrap();
    assert_eq!(p4d.coverage_percent, Some(Decimal::new(1000, 1)));
    assert!(c
        .coverage
        .iter()
        .any(|t| t.coverage_percent == Some(Decimal::new(0, 1))));
    // Every demo GPU host reports but the dev box nobody installed the agent on: it is in the
    // ledger on a host known from the bill, all of it unmonitored.
    let listed: Vec<(&str, bool)> = r
        .gpu_without_agent
        .iter()
        .map(|c| (c.resource.as_str(), c.in_ledger))
        .collect();
    assert_eq!(listed, [(FORGOTTEN_INSTANCE, true)]);
    let forgotten: Decimal = lines
        .iter()
        .filter(|l| l.resource_key.as_deref() == Some(FORGOTTEN_INSTANCE))
        .map(|l| l.effective_cost)
        .sum();
    assert!(forgotten > Decimal::ZERO);
    assert_eq!(r.gpu_without_agent_total(), forgotten);
    assert_eq!(r.attributed.unmonitored, forgotten, "{r:?}");
    // This month's budgets for the three teams, each with a forecast from the weekday pattern.
    let budgets = crate::budgets::for_month(
        store.as_ref(),
        (
            &gpuledger_core::owners::OwnerSchema::default(),
            &gpuledger_core::scope::Scope::all(),
        ),
        gpuledger_core::time::month_of(now),
        now,
    )
    .await
    .unwrap();
    let teams: std::collections::BTreeSet<&str> = budgets.iter().map(|b| b.key.as_str()).collect();
    assert_eq!(teams, ["applied", "foundation", "research"].into());
    for b in &budgets {
        assert!(b.forecast.basis_days >= 28, "{b:?}");
        assert!(
            b.forecast.expected > b.forecast.spent,
            "{b:?}: the month goes on"
        );
        assert!(b.forecast.low <= b.forecast.expected && b.forecast.expected <= b.forecast.high);
    }
    // Idle history from the ledger: the idle H100 hosts are idle the whole month, and the
    // episodes carry exactly the month's idle and held-idle dollars.
    let episodes = crate::idle_history::load(store.as_ref(), from, to)
        .await
        .unwrap();
    // The database's sums per host-hour give exactly the episodes of the hourly ledger itself.
    let hourly = crate::ledger::load(store.as_ref(), from, to, crate::store::RollupGrain::Hour)
        .await
        .unwrap();
    assert_eq!(episodes, crate::idle_history::episodes(&hourly));
    let t = &gpuledger_core::allocation::totals(&a, &gpuledger_core::carbon::Grid::unknown())[0];
    assert_eq!(
        episodes.iter().map(|e| e.cost).sum::<Decimal>(),
        t.idle_cost + t.held_idle_cost
    );
    for host in ["scratch-00", "scratch-01"] {
        let e = episodes
            .iter()
            .find(|e| e.hostname == host && e.kind == "idle")
            .unwrap_or_else(|| panic!("{host}: {episodes:?}"));
        assert_eq!(
            (e.start_ms, e.end_ms),
            (from, to),
            "{host}: the whole month"
        );
        assert_eq!(e.gpus.len(), 8);
    }
    assert!(episodes.iter().any(|e| e.kind == "held_idle"
        && e.owners
            .get("experiment")
            .is_some_and(|v| v == &["notebook"])));
    let kinds: std::collections::BTreeSet<_> = a.parts.iter().map(|p| p.kind).collect();
    assert!(kinds.contains(&gpuledger_core::attribution::Kind::Used));
    assert!(kinds.contains(&gpuledger_core::attribution::Kind::HeldIdle));
    assert!(kinds.contains(&gpuledger_core::attribution::Kind::Idle));
    // The serving code's request counts give each endpoint a cost per 1,000 requests.
    let requests = store::usage::usage_totals(store.db(), from, to)
        .await
        .unwrap();
    let unit = crate::unit_costs::endpoint_costs(
        &a,
        &requests,
        &gpuledger_core::owners::OwnerSchema::default(),
    );
    let names: Vec<&str> = unit.iter().map(|e| e.endpoint.as_str()).collect();
    assert_eq!(names.len(), 3, "{names:?}");
    for endpoint in ["embeddings", "chat-api", "rerank"] {
        assert!(names.contains(&endpoint), "{names:?}");
    }
    assert!(unit
        .iter()
        .all(|e| e.cost_per_1k_requests.is_some_and(|c| c > Decimal::ZERO)));
    // The training code's progress gives each week's sweep a cost per 1,000 steps.
    let progress = store::usage::progress_totals(store.db(), from, to)
        .await
        .unwrap();
    let mut runs =
        crate::unit_costs::training_runs(&a, &gpuledger_core::owners::OwnerSchema::default());
    crate::unit_costs::with_progress(&mut runs, &progress);
    let sweeps: Vec<&crate::unit_costs::TrainingRun> =
        runs.iter().filter(|r| r.steps.is_some()).collect();
    assert!(!sweeps.is_empty(), "{progress:?}");
    for r in &sweeps {
        assert!(r.steps.is_some_and(|s| s > 0), "{r:?}");
        assert!(
            r.cost_per_1k_steps.is_some_and(|c| c > Decimal::ZERO),
            "{r:?}"
        );
    }

    // Scale-to-zero: the reranker nobody calls at night or at weekends, and the notebooks held
    // idle all week; never the chat endpoint, busy day and night, nor a training sweep.
    let quiet = crate::scale_to_zero::for_range(
        store.as_ref(),
        &gpuledger_core::owners::OwnerSchema::default(),
        &gpuledger_core::scope::EVERY_TEAM,
        from,
        to,
    )
    .await
    .unwrap();
    let owners: Vec<(&str, &str)> = quiet
        .iter()
        .map(|q| (q.dimension.as_str(), q.candidate.key.as_str()))
        .collect();
    assert_eq!(
        owners
            .iter()
            .filter(|(d, _)| *d == "endpoint")
            .collect::<Vec<_>>(),
        [&("endpoint", "rerank")],
        "{owners:?}"
    );
    assert!(owners.contains(&("experiment", "notebook")), "{owners:?}");
    let rerank = &quiet
        .iter()
        .find(|q| q.candidate.key == "rerank")
        .unwrap()
        .candidate;
    let windows: Vec<&str> = rerank.windows.iter().map(|w| w.label.as_str()).collect();
    assert_eq!(
        windows,
        [
            "Mon 20:00 – Tue 08:00 UTC",
            "Tue 20:00 – Wed 08:00 UTC",
            "Wed 20:00 – Thu 08:00 UTC",
            "Thu 20:00 – Fri 08:00 UTC",
            "Fri 20:00 – Mon 08:00 UTC",
        ]
    );
    // Its saving is exactly its held-idle cost in the month: the hours it was quiet.
    let rerank_held: Decimal = a
        .parts
        .iter()
        .filter(|p| {
            p.owner.get("endpoint") == Some("rerank")
                && p.kind == gpuledger_core::attribution::Kind::HeldIdle
        })
        .map(|p| p.cost)
        .sum();
    assert_eq!(rerank.saving, rerank_held);
    let notebook = &quiet
        .iter()
        .find(|q| q.candidate.key == "notebook")
        .unwrap()
        .candidate;
    assert_eq!(notebook.hours_per_week, 168);

    // The week's shape: the training cluster's 64 A100s held every hour (its floor is its
    // peak), foundation's six hosts and research's two notebook hosts; the reranker's L4s held
    // all week though quiet at night (shape counts what is paid for).
    let shape = crate::shape::for_range(
        store.as_ref(),
        &gpuledger_core::owners::OwnerSchema::default(),
        &gpuledger_core::scope::EVERY_TEAM,
        (from, to),
        now,
    )
    .await
    .unwrap();
    let p4d = shape
        .iter()
        .find(|t| t.instance_type == "p4d.24xlarge")
        .unwrap();
    assert_eq!((p4d.spread.floor, p4d.spread.peak), (64.0, 64.0), "{p4d:?}");
    let teams: Vec<(Option<&str>, f64)> = p4d
        .owners
        .iter()
        .map(|o| (o.owner.as_deref(), o.spread.floor))
        .collect();
    assert_eq!(
        teams,
        [(Some("foundation"), 48.0), (Some("research"), 16.0)]
    );
    let l4 = shape
        .iter()
        .find(|t| t.instance_type == "g6.xlarge")
        .unwrap();
    assert_eq!((l4.spread.floor, l4.spread.peak), (4.0, 4.0), "{l4:?}");
    // The purchase mix: the training type committed at the rate the bill applied (60 % of
    // on demand) beats on demand; the L4s have no commitment price to weigh.
    let mixes = crate::purchase::of_shapes(&card, &shape, &costs);
    let p4d_mix = mixes
        .iter()
        .find(|m| m.instance_type == "p4d.24xlarge")
        .unwrap();
    assert_eq!(p4d_mix.floor_instances, 8);
    let committed = p4d_mix
        .options
        .iter()
        .find(|o| o.committed_instances > 0)
        .unwrap();
    assert_eq!(committed.break_even_percent, Some(Decimal::new(600, 1)));
    assert!(committed.cost < p4d_mix.options[0].cost);
    // The sweeps' work on spot (the rate card's, 40 % of on demand) is cheaper still; with
    // the floor committed nothing of theirs is left above it, so no third option.
    let spot = p4d_mix
        .options
        .iter()
        .find(|o| o.spot_gpu_hours > 0.0)
        .unwrap();
    assert_eq!(spot.committed_instances, 0);
    assert!(spot.cost < committed.cost, "{p4d_mix:?}");
    assert_eq!(p4d_mix.cheapest, spot.choice);
    assert_eq!(p4d_mix.options.len(), 3, "{p4d_mix:?}");
    assert!(
        (spot.spot_gpu_hours - p4d.interruptible_gpu_hours).abs() < 0.01,
        "{p4d:?}"
    );
    // Priced like the bill: all on demand is the hours at the rate card's on-demand price.
    let hours = Decimal::from(p4d.hours as u64);
    assert_eq!(
        p4d_mix.options[0].cost,
        (Decimal::from(8) * hours * card.instance_types["p4d.24xlarge"].on_demand).round_dp(2)
    );
    let l4_mix = mixes
        .iter()
        .find(|m| m.instance_type == "g6.xlarge")
        .unwrap();
    assert!(
        l4_mix.missing.as_deref().unwrap().contains("commit_1y"),
        "{l4_mix:?}"
    );

    // The review's recommendations for the previous month: on separate GPUs, each saving
    // within what its GPUs cost over the same days, the headline their sum.
    let range = crate::recommend::snapshots::review_range(from, to, now).unwrap();
    let recs = crate::recommend::snapshots::get(
        store.as_ref(),
        &card,
        &gpuledger_core::owners::OwnerSchema::default(),
        range,
        now,
    )
    .await
    .unwrap();
    let mut covered: Vec<(String, Decimal, Decimal)> = Vec::new();
    for x in &recs.right_size {
        covered.extend(x.gpus.iter().map(|g| (g.clone(), x.saving, x.cost)));
    }
    for x in &recs.consolidation {
        covered.extend(x.gpus.iter().map(|g| (g.clone(), x.saving, x.cost)));
    }
    for x in &recs.spot {
        covered.extend(x.gpus.iter().map(|g| (g.clone(), x.saving, x.cost)));
    }
    for x in &recs.release {
        covered.extend(x.gpus.iter().map(|g| (g.clone(), x.saving, x.cost)));
    }
    // The held-idle notebooks are told to stop or release their GPUs (16 of them), not to
    // move to spot or to pack: on hosts the savings plan covers, that frees commitment and
    // saves no cash. The scratch cluster nobody ran anything on (16 H100s, the biggest waste)
    // is told to release its GPUs, in cash: a load test another month is no reason to fold
    // them into an endpoint's right-sizing.
    let notebooks: Vec<_> = (recs.release.iter())
        .filter(|x| x.owners.get("experiment").map(String::as_str) == Some("notebook"))
        .collect();
    assert_eq!(
        notebooks.iter().map(|x| x.gpus.len()).sum::<usize>(),
        16,
        "{recs:?}"
    );
    assert!(
        notebooks
            .iter()
            .all(|x| x.saving.is_zero() && x.frees_commitment == x.cost && !x.cost.is_zero()),
        "{notebooks:?}"
    );
    let scratch: Vec<_> = (recs.release.iter())
        .filter(|x| x.host.starts_with("scratch-"))
        .collect();
    assert_eq!(
        scratch.iter().map(|x| x.gpus.len()).sum::<usize>(),
        16,
        "{recs:?}"
    );
    assert!(
        scratch.iter().all(|x| x.owners.is_empty()
            && x.saving == x.cost
            && x.frees_commitment.is_zero()
            && x.action.contains("no process ran")),
        "{scratch:?}"
    );
    assert_eq!(
        recs.release.len(),
        notebooks.len() + scratch.len(),
        "{recs:?}"
    );
    // Each endpoint is sized per GPU model it ran on: chat-api's A10Gs alone.
    assert!(
        (recs.right_size.iter())
            .filter(|x| x.key == "chat-api")
            .all(|x| x.current_gpu == "A10G" && x.gpus.iter().all(|g| g.contains("serve-west"))),
        "{recs:?}"
    );
    assert!(
        recs.spot.iter().all(|s| s.experiment != "notebook"),
        "{recs:?}"
    );
    let gpus: std::collections::BTreeSet<&str> =
        covered.iter().map(|(g, _, _)| g.as_str()).collect();
    assert_eq!(
        gpus.len(),
        covered.len(),
        "no GPU in two recommendations: {recs:?}"
    );
    assert!(
        covered.iter().all(|(_, saving, cost)| saving <= cost),
        "{recs:?}"
    );
    assert!(
        (recs.release.iter()).all(|x| x.saving + x.frees_commitment <= x.cost)
            && (recs.right_size.iter()).all(|x| x.saving + x.frees_commitment <= x.cost)
            && (recs.consolidation.iter()).all(|x| x.saving + x.frees_commitment <= x.cost),
        "cash and freed commitment together never above the cost: {recs:?}"
    );
    let sum: Decimal = recs.right_size.iter().map(|x| x.saving).sum::<Decimal>()
        + recs.consolidation.iter().map(|x| x.saving).sum::<Decimal>()
        + recs.spot.iter().map(|x| x.saving).sum::<Decimal>()
        + recs.release.iter().map(|x| x.saving).sum::<Decimal>();
    // The demo's fleet is billed in dollars: one total.
    assert_eq!(recs.total_saving.len(), 1, "{recs:?}");
    assert_eq!(recs.total_in("USD"), sum);
    assert!(recs.total_in("USD") > Decimal::ZERO, "{recs:?}");
    let week = crate::ledger::load(
        store.as_ref(),
        range.from_ms,
        range.to_ms,
        crate::store::RollupGrain::HostDay,
    )
    .await
    .unwrap();
    let week_cost: Decimal = week.parts.iter().map(|p| p.cost).sum();
    assert!(
        recs.total_in("USD") < week_cost,
        "{} < {week_cost}",
        recs.total_in("USD")
    );

    // The month under way's last two days are not billed yet: each hour of the committed
    // training hosts is estimated at what the bill last charged them (the savings plan's rate,
    // 60 % of on demand), not at the rate card's on-demand price; so no sweep is told to move
    // to spot, and the hosts' burn rate is the billed one.
    let (this_from, this_to) = gpuledger_core::time::month_of(now);
    let this = crate::attribution::compute(store.as_ref(), &card, &rules, this_from, now)
        .await
        .unwrap();
    let train_east: std::collections::HashSet<i64> = this
        .hosts
        .values()
        .filter(|h| h.cluster == "train-east")
        .map(|h| h.id)
        .collect();
    let mut per_host_hour: BTreeMap<(i64, i64), Decimal> = BTreeMap::new();
    for p in this
        .parts
        .iter()
        .filter(|p| train_east.contains(&p.host_id))
    {
        if p.estimated {
            assert_eq!(p.pricing_category, "committed", "{p:?}");
        }
        *per_host_hour.entry((p.host_id, p.hour_ms)).or_default() += p.cost;
    }
    let committed_rate = card.instance_types["p4d.24xlarge"].on_demand * Decimal::new(6, 1);
    let estimated_hours: Vec<i64> = this
        .parts
        .iter()
        .filter(|p| p.estimated && train_east.contains(&p.host_id))
        .map(|p| p.hour_ms)
        .collect();
    assert!(
        estimated_hours.len() > 8 * 40,
        "two days after the bill's last line"
    );
    for ((_, hour), cost) in &per_host_hour {
        if *hour < gpuledger_core::time::hour_floor(now) {
            assert_eq!(*cost, committed_rate, "{hour}");
        }
    }
    let this_range = crate::recommend::snapshots::review_range(this_from, this_to, now).unwrap();
    let this_recs = crate::recommend::snapshots::get(
        store.as_ref(),
        &card,
        &gpuledger_core::owners::OwnerSchema::default(),
        this_range,
        now,
    )
    .await
    .unwrap();
    assert!(
        this_recs
            .spot
            .iter()
            .all(|s| !s.experiment.starts_with("exp-lr-sweep")),
        "a sweep on a savings plan is not on demand: {:?}",
        this_recs.spot
    );
    let hosts = store::telemetry::hosts(store.db()).await.unwrap();
    let train_host = hosts
        .iter()
        .find(|h| h.hostname == "train-east-00")
        .unwrap();
    let names: std::collections::HashMap<i64, Vec<String>> =
        [(train_host.id, vec!["NVIDIA A100-SXM4-80GB".to_owned(); 8])].into();
    let prices = crate::billing::current_price::gpu_prices(
        store.as_ref(),
        std::slice::from_ref(train_host),
        &names,
        &card,
        now,
    )
    .await
    .unwrap();
    assert_eq!(
        (
            prices[&train_host.id].per_gpu_hour,
            prices[&train_host.id].estimated
        ),
        (committed_rate / Decimal::from(8), false),
        "the burn rate of a host billed two days ago"
    );

    // Started at 26 minutes past the hour, the demo's newest window is 26 minutes long: its
    // idle H100 cluster and held-idle notebooks are incidents at once all the same (the
    // hour-long window before it counts), and stay open while the demo keeps reporting.
    let config = crate::config::Config::default();
    crate::incidents::evaluate(store.as_ref(), &card, &config, now)
        .await
        .unwrap();
    let kinds = |open: &[crate::store::alerts::IncidentRow]| {
        open.iter()
            .map(|i| (i.kind.clone(), i.cluster.clone()))
            .collect::<std::collections::BTreeSet<_>>()
    };
    let open = store::alerts::open_incidents(store.db()).await.unwrap();
    let found = kinds(&open);
    assert!(
        found.contains(&("cluster_idle".to_owned(), "scratch".to_owned())),
        "{found:?}"
    );
    assert!(
        found.contains(&("held_idle".to_owned(), "train-east".to_owned())),
        "{found:?}"
    );
    // One incident per notebook host, not one per GPU.
    let notebooks =
        |i: &&crate::store::alerts::IncidentRow| i.kind == "held_idle" && i.cluster == "train-east";
    assert_eq!(open.iter().filter(notebooks).count(), 2);
    // On a Sunday night the reranker nobody calls holds its four hosts' GPUs idle: one
    // incident per host, since Friday 20:00.
    let reranker: Vec<_> = open
        .iter()
        .filter(|i| i.kind == "held_idle" && i.cluster == "serve-eu")
        .collect();
    assert_eq!(reranker.len(), 4, "{reranker:?}");
    // The incidents start where the idle run began, not at the evaluation's short look-back:
    // the H100 cluster at midnight, when yesterday's load test ended; the notebooks, held idle
    // all along, when the demo's history begins, as the ledger has it: not where the raw
    // windows read for it stop (35 days), which is no fact about the notebooks.
    let scratch = open.iter().find(|i| i.cluster == "scratch").unwrap();
    assert_eq!(scratch.started_ms, load_test_day(now).1);
    let history_began = month_start_ms(month_start_ms(now) - 1);
    for i in open.iter().filter(notebooks) {
        assert_eq!(
            i.started_ms,
            history_began,
            "{} {} started {} h ago",
            i.kind,
            i.cluster,
            (now - i.started_ms) / HOUR_MS
        );
    }
    let later = now - now % 60_000 + 10 * 60_000;
    let fed = report_live(store.as_ref(), now - now % 60_000, later)
        .await
        .unwrap();
    assert!(fed > 100, "{fed}");
    crate::incidents::evaluate(store.as_ref(), &card, &config, later)
        .await
        .unwrap();
    let still = kinds(&store::alerts::open_incidents(store.db()).await.unwrap());
    assert!(found.is_subset(&still), "{found:?} then {still:?}");
}

#[test]
fn the_load_test_is_yesterday_and_over_long_enough_to_be_idle_at_any_hour() {
    let midnight = 1_795_305_600_000; // 2026-11-23 00:00 UTC
    for minutes in [0, 5, 59, 60, 119, 121, 180, 600, 1439] {
        let now = midnight + minutes * 60_000;
        let (from, to) = load_test_day(now);
        assert_eq!(from, midnight - DAY_MS, "{minutes}");
        assert!(to <= midnight, "{minutes}");
        // Idle for two hours at least when the demo starts: more than any idle duration.
        assert!(
            now - to >= 2 * HOUR_MS,
            "{minutes}: idle {} min",
            (now - to) / 60_000
        );
        assert_eq!(to % HOUR_MS, 0);
        assert!(to - from >= 20 * HOUR_MS, "{minutes}");
    }
}

//! Anomalies on the simulated fleet: none on its normal pattern (weekly sweeps, day and night
//! serving, estimates for the days the bill has not covered), and every spike and new level
//! injected into it found, announced once and dismissable; on both databases.

use std::collections::BTreeMap;

use gpuledger_core::anomaly::AnomalyKind;
use gpuledger_core::time::{month_start_ms, DAY_MS, HOUR_MS};
use gpuledger_proto::{GpuWindow, HostInfo, ProcessWindow, Report, Window};

use super::*;
use crate::store::AgentStatus;

/// Monday 2026-11-23, 20:00 UTC.
const NOW: i64 = 1_795_464_000_000;

/// What a view at [`NOW`] keeps: the ledger before November, whose days are final (the spikes
/// below are injected into November, read live).
fn kept() -> Keep {
    Keep::before(day("2026-11-01"), NOW)
}

fn day(s: &str) -> i64 {
    chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d")
        .unwrap()
        .and_hms_opt(0, 0, 0)
        .unwrap()
        .and_utc()
        .timestamp_millis()
}

fn config(dimensions: &[&str]) -> Config {
    let mut c: Config = toml::from_str(
        r#"
[slack]
default_webhook = "https://hooks.slack.com/services/T/B/default"
[[slack.routes]]
team = "research"
webhook = "https://hooks.slack.com/services/T/B/research"
"#,
    )
    .unwrap();
    c.anomalies.dimensions = dimensions.iter().map(|d| d.to_string()).collect();
    c
}

/// Hosts that were not in the fleet: `count` machines of `instance_type` in `cluster`, every
/// GPU running one process labelled with `team`, busy or holding memory, in `[from, to)`.
async fn inject(
    store: &dyn Store,
    (cluster, instance_type, count): (&str, &str, usize),
    (team, busy): (&str, bool),
    (from, to): (i64, i64),
) {
    let token = crate::store::tokens::token_by_name(store.db(), &format!("demo-{cluster}"))
        .await
        .unwrap()
        .unwrap();
    for h in 0..count {
        let hostname = format!("{cluster}-extra-{team}-{h}");
        let mut windows = Vec::new();
        let mut t = from;
        while t < to {
            let end = (t + HOUR_MS).min(to);
            let util = if busy { 90.0 } else { 0.5 };
            windows.push(Window {
                serving: Vec::new(),
                start_ms: t,
                end_ms: end,
                samples: ((end - t) / 1000) as u32,
                gpus: (0..8)
                    .map(|g| GpuWindow {
                        uuid: format!("GPU-extra-{hostname}-{g}"),
                        index: g,
                        name: "NVIDIA H100 80GB HBM3".into(),
                        memory_total_bytes: Some(80 << 30),
                        memory_used_max_bytes: Some(40 << 30),
                        util_avg: Some(util),
                        util_max: Some(util),
                        processes: vec![ProcessWindow {
                            pid: 20_000 + g,
                            name: Some("python3".into()),
                            user: Some("svc-burst".into()),
                            memory_used_max_bytes: Some(40 << 30),
                            labels: BTreeMap::from([("team".into(), team.into())]),
                            ..Default::default()
                        }],
                        ..Default::default()
                    })
                    .collect(),
            });
            t = end;
        }
        for (i, chunk) in windows.chunks(24).enumerate() {
            let report = Report {
                batch_id: format!("extra-{hostname}-{i}"),
                agent_version: "test".into(),
                host: HostInfo {
                    hostname: hostname.clone(),
                    cluster: cluster.into(),
                    provider: Some("aws".into()),
                    instance_id: Some(format!("i-0extra{team}{h}")),
                    instance_type: Some(instance_type.into()),
                    region: Some("us-east-1".into()),
                    lifecycle: Some("on_demand".into()),
                },
                windows: chunk.to_vec(),
            };
            let outcome = store
                .ingest(&report, token.id, AgentStatus::default(), NOW)
                .await
                .unwrap();
            assert_eq!(outcome, crate::store::IngestOutcome::Stored);
        }
    }
}

fn summary(found: &[OwnerAnomaly]) -> Vec<(String, String, String, AnomalyKind)> {
    let mut out: Vec<_> = found
        .iter()
        .map(|a| {
            (
                a.dimension.clone(),
                a.key.clone(),
                gpuledger_core::time::rfc3339(a.anomaly.start_ms)[..10].to_owned(),
                a.anomaly.kind,
            )
        })
        .collect();
    out.sort();
    out
}

/// Each dimension's spend per key and day, as anomalies read it (summed by the database per
/// owner value, or from host-days for a host's dimension), is the host-days' summed per key:
/// cost to the atto-dollar, over whole days and the partial day up to now.
async fn daily_spend_is_the_ledger_s(store: &dyn Store, b: &str) {
    let schema = gpuledger_core::owners::OwnerSchema::default();
    let dimensions: Vec<GroupBy> = [
        "team",
        "model",
        "cluster",
        "instance_type",
        "pricing_category",
    ]
    .iter()
    .map(|d| GroupBy::parse(d, &schema).unwrap())
    .collect();
    let from = day("2026-10-01");
    let got = crate::ledger::daily_spend(store, &dimensions, (from, NOW), Keep::NOTHING)
        .await
        .unwrap();
    // October's days kept as a closed month's: computed, then read back, the same.
    for read in ["computed", "read back"] {
        let kept = crate::ledger::daily_spend(store, &dimensions, (from, NOW), kept())
            .await
            .unwrap();
        assert_eq!(kept, got, "{b}: {read}");
    }
    let ledger = crate::ledger::load(store, from, NOW, RollupGrain::HostDay)
        .await
        .unwrap();
    let mut want = crate::ledger::DailySpend::new();
    for p in &ledger.parts {
        for by in &dimensions {
            let d = want
                .entry((*by, key_of(p, *by, &ledger), p.currency.clone()))
                .or_default()
                .entry(day_floor(p.hour_ms))
                .or_default();
            d.cost += p.cost;
            d.gpu_seconds += p.gpu_seconds;
            d.estimated |= p.estimated;
        }
    }
    assert!(want.len() > 20, "{b}: keys in the fixture: {}", want.len());
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "{b}"
    );
    for (key, days) in &want {
        let g = &got[key];
        assert_eq!(
            g.keys().collect::<Vec<_>>(),
            days.keys().collect::<Vec<_>>()
        );
        for (d, spend) in days {
            assert_eq!(g[d].cost, spend.cost, "{b}: {key:?} {d}");
            assert_eq!(g[d].estimated, spend.estimated, "{b}: {key:?} {d}");
            assert!(
                (g[d].gpu_seconds - spend.gpu_seconds).abs() < 1e-3,
                "{b}: {key:?} {d}"
            );
        }
    }
}

#[tokio::test]
async fn injected_spikes_and_new_levels_are_found_and_the_normal_fleet_is_quiet() {
    for db in crate::test_support::both().await {
        let b = db.backend;
        let store = db.open().await;
        let card = gpuledger_core::ratecard::RateCard::default_card();
        let all = config(&["model", "experiment", "endpoint", "team"]);
        crate::demo::seed(store.as_ref(), &card, &all.attribution_rules(), NOW)
            .await
            .unwrap();
        // The normal pattern, every owner dimension, from the first day a baseline exists:
        // nothing but the serving team's load test on the idle H100s yesterday.
        let demo_from = month_start_ms(month_start_ms(NOW) - 1);
        let quiet = find(
            store.as_ref(),
            &all,
            (demo_from, NOW + DAY_MS),
            (NOW, kept()),
        )
        .await
        .unwrap();
        let yesterday = |dimension: &str, key: &str| {
            (
                dimension.to_owned(),
                key.to_owned(),
                "2026-11-22".to_owned(),
                AnomalyKind::Spike,
            )
        };
        assert_eq!(
            summary(&quiet),
            vec![
                yesterday("endpoint", "chat-api"),
                // Serving carries no experiment label.
                yesterday("experiment", "(unlabeled)"),
                yesterday("model", "mistral-7b"),
                yesterday("team", "applied"),
            ],
            "{b}: {quiet:#?}"
        );
        let load_test = quiet.iter().find(|a| a.key == "applied").unwrap();
        // The idle cluster's two hosts drove it most (then the spot hosts the rate card
        // prices above what their bill charged).
        assert!(
            load_test.drivers[..2]
                .iter()
                .all(|d| d.cluster == "scratch"),
            "{b}: the idle cluster's hosts drove it: {:#?}",
            load_test.drivers
        );

        // A spike: two H100 hosts serving for team applied all Wednesday the 11th.
        inject(
            store.as_ref(),
            ("serve-west", "p5.48xlarge", 2),
            ("applied", true),
            (day("2026-11-11"), day("2026-11-12")),
        )
        .await;
        // A new level: two more A100 hosts held by research from Sunday the 15th on.
        inject(
            store.as_ref(),
            ("train-east", "p4d.24xlarge", 2),
            ("research", false),
            (day("2026-11-15"), NOW),
        )
        .await;
        // Today's spike: four H100 hosts training for foundation since midnight.
        inject(
            store.as_ref(),
            ("train-east", "p5.48xlarge", 4),
            ("foundation", true),
            (day("2026-11-23"), NOW),
        )
        .await;
        crate::test_support::roll_up(store.as_ref()).await;
        daily_spend_is_the_ledger_s(store.as_ref(), b).await;
        let teams = config(&["team"]);
        let found = find(
            store.as_ref(),
            &teams,
            (day("2026-11-01"), NOW + DAY_MS),
            (NOW, kept()),
        )
        .await
        .unwrap();
        let t = |k: &str, d: &str, kind| ("team".to_owned(), k.to_owned(), d.to_owned(), kind);
        assert_eq!(
            summary(&found),
            vec![
                t("applied", "2026-11-11", AnomalyKind::Spike),
                t("applied", "2026-11-22", AnomalyKind::Spike),
                t("foundation", "2026-11-23", AnomalyKind::Spike),
                t("research", "2026-11-15", AnomalyKind::NewLevel),
            ],
            "{b}: {found:#?}"
        );
        let applied = found
            .iter()
            .find(|a| a.key == "applied" && a.anomaly.start_ms == day("2026-11-11"))
            .unwrap();
        assert!(applied.anomaly.actual > applied.anomaly.expected, "{b}");
        assert!(
            applied
                .drivers
                .iter()
                .all(|d| d.host.starts_with("serve-west-extra-applied")),
            "{b}: the new hosts drove it: {:#?}",
            applied.drivers
        );
        assert!(
            applied.drivers[0].processes[0]
                .label()
                .contains("svc-burst"),
            "{b}: {:#?}",
            applied.drivers
        );
        let today = found.iter().find(|a| a.key == "foundation").unwrap();
        assert!(
            today.anomaly.days[0].partial,
            "{b}: found the day it happens"
        );

        // Slack: what is going on now (foundation today, the load test yesterday, research's
        // level), once each; the spike of the 11th is past.
        let queued = alert(store.as_ref(), &teams, NOW).await.unwrap();
        assert_eq!(queued, 3, "{b}");
        assert_eq!(
            alert(store.as_ref(), &teams, NOW + 60_000).await.unwrap(),
            0,
            "{b}"
        );
        let sent = crate::store::alerts::slack_history(store.db(), 10)
            .await
            .unwrap();
        let mut routes: Vec<(&str, &str)> = sent
            .iter()
            .map(|m| (m.event.as_str(), m.route.as_str()))
            .collect();
        routes.sort_unstable();
        assert_eq!(
            routes,
            vec![
                ("anomaly", "default"),
                ("anomaly", "default"),
                ("anomaly", "team:research")
            ],
            "{b}"
        );
        let research = sent.iter().find(|m| m.route == "team:research").unwrap();
        assert!(
            research.payload.contains("New spend level: team research")
                && research.payload.contains("train-east-extra-research"),
            "{b}: {}",
            research.payload
        );

        // Dismissed: recorded with who and why, shown so, not announced again; once only.
        let ask = |start| Dismiss {
            dimension: "team",
            key: "research",
            currency: "usd",
            start,
            reason: "capacity for the December launch",
        };
        let row = dismiss(store.as_ref(), &teams, ask("2026-11-15"), "ana", NOW)
            .await
            .unwrap();
        assert_eq!((row.dismissed_by.as_str(), row.dismissed_ms), ("ana", NOW));
        let again = dismiss(store.as_ref(), &teams, ask("2026-11-15"), "bo", NOW).await;
        assert!(
            matches!(again, Err(DismissError::AlreadyDismissed(ref m)) if m.contains("ana")),
            "{b}: {again:?}"
        );
        let missing = dismiss(store.as_ref(), &teams, ask("2026-11-16"), "bo", NOW).await;
        assert!(
            matches!(missing, Err(DismissError::NotFound(_))),
            "{b}: {missing:?}"
        );
        let bad = dismiss(store.as_ref(), &teams, ask("15/11/2026"), "bo", NOW).await;
        assert!(
            matches!(bad, Err(DismissError::Invalid { field: "start", .. })),
            "{b}: {bad:?}"
        );
        let shown = find(
            store.as_ref(),
            &teams,
            (day("2026-11-01"), NOW + DAY_MS),
            (NOW, kept()),
        )
        .await
        .unwrap();
        let r = shown.iter().find(|a| a.key == "research").unwrap();
        assert_eq!(
            r.dismissed
                .as_ref()
                .map(|d| (d.by.as_str(), d.reason.as_str())),
            Some(("ana", "capacity for the December launch")),
            "{b}"
        );
        assert!(
            shown.last().is_some_and(|a| a.key == "research"),
            "{b}: dismissed last"
        );
    }
}

/// A team-scoped reader sees its teams' anomalies, and of their drivers only its teams'
/// processes; not a model's, whose history may be another team's.
#[test]
fn a_scoped_reader_sees_its_teams_anomalies_and_processes_only() {
    use gpuledger_core::anomaly::AnomalyKind;
    let schema = OwnerSchema::default();
    let process = |team: &str| ProcessSeen {
        name: "python3".into(),
        user: Some(format!("svc-{team}")),
        labels: BTreeMap::from([("team".to_owned(), team.to_owned())]),
    };
    let anomaly = |dimension: &str, key: &str| OwnerAnomaly {
        dimension: dimension.into(),
        key: key.into(),
        currency: "USD".into(),
        anomaly: Anomaly {
            kind: AnomalyKind::Spike,
            start_ms: 0,
            days: Vec::new(),
            expected: Decimal::ONE,
            actual: Decimal::TEN,
        },
        peak_day_ms: 0,
        drivers: vec![Driver {
            cluster: "c".into(),
            host: "h".into(),
            gpus: Vec::new(),
            expected: Decimal::ONE,
            actual: Decimal::TEN,
            processes: vec![process("alpha"), process("bravo")],
        }],
        dismissed: None,
    };
    let found = vec![
        anomaly("team", "alpha"),
        anomaly("team", "bravo"),
        anomaly("model", "mine"),
        anomaly("model", "shared"),
        anomaly("nonsense", "alpha"),
    ];
    let alpha = Scope::teams(["alpha"]).unwrap();
    let seen = within_scope(found.clone(), (&alpha, &schema));
    let names: Vec<(&str, &str)> = seen
        .iter()
        .map(|a| (a.dimension.as_str(), a.key.as_str()))
        .collect();
    assert_eq!(names, vec![("team", "alpha")]);
    for a in &seen {
        let users: Vec<_> = a.drivers[0]
            .processes
            .iter()
            .map(|p| p.user.clone())
            .collect();
        assert_eq!(users, vec![Some("svc-alpha".to_owned())]);
    }
    assert_eq!(within_scope(found.clone(), (&Scope::all(), &schema)), found);
}

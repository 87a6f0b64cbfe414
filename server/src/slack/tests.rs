use super::*;

#[test]
fn slack_answers() {
    let now = 1_000_000;
    assert_eq!(classify(Some(200), None, "ok", 1, now), Outcome::Sent);
    assert_eq!(
        classify(Some(429), Some(7), "", 1, now),
        Outcome::RetryAt(now + 7_000)
    );
    assert_eq!(
        classify(Some(500), None, "rollup_error", 1, now),
        Outcome::RetryAt(now + 5_000)
    );
    assert_eq!(
        classify(Some(503), None, "", 3, now),
        Outcome::RetryAt(now + 20_000)
    );
    assert!(matches!(
        classify(Some(500), None, "", MAX_ATTEMPTS, now),
        Outcome::Failed(_)
    ));
    assert!(
        matches!(classify(Some(410), None, "channel_is_archived", 1, now), Outcome::Failed(m) if m.contains("channel_is_archived"))
    );
    assert!(matches!(
        classify(Some(400), None, "invalid_payload", 1, now),
        Outcome::Failed(_)
    ));
    assert_eq!(
        classify(None, None, "timeout", 1, now),
        Outcome::RetryAt(now + 5_000)
    );
}

#[test]
fn labels_are_escaped_for_mrkdwn() {
    assert_eq!(escape("<script>&"), "&lt;script&gt;&amp;");
}

#[test]
fn texts_are_cut_to_slacks_limits_never_inside_an_entity() {
    assert_eq!(clip("short", 150), "short");
    let long = "é".repeat(200);
    let cut = clip(&long, 150);
    assert_eq!(cut.chars().count(), 150);
    assert!(cut.ends_with('…'));
    assert_eq!(clip_escaped("a<b", 10), "a&lt;b");
    // 4 characters of room: "a" fits, "&lt;" would pass the limit with the ellipsis.
    assert_eq!(clip_escaped("a<b<c", 5), "a…");
    let hostile = "&".repeat(1_000);
    let cut = clip_escaped(&hostile, 2_000);
    assert!(cut.chars().count() <= 2_000, "{}", cut.chars().count());
    assert!(cut.trim_end_matches('…').ends_with("&amp;"));
}

fn incident(cluster: &str, hostname: Option<&str>, owners: &str) -> IncidentRow {
    IncidentRow {
        id: 7,
        incident_key: "k".into(),
        kind: "idle_cluster".into(),
        cluster: cluster.into(),
        hostname: hostname.map(str::to_owned),
        gpus_json: serde_json::to_string(&vec!["GPU-1"; 64]).unwrap_or_default(),
        owners_json: owners.into(),
        devices_json: "[]".into(),
        started_ms: 0,
        ended_ms: None,
        last_seen_ms: 0,
        cost_per_hour: "110.08".into(),
        currency: "USD".into(),
        wasted: "2862.08".into(),
        estimated: 0,
        last_notified_ms: None,
        intended_by: None,
        intended_ms: None,
    }
}

/// Every message, with the longest and most hostile names an agent can send, passes
/// slack_sdk's Block Kit validation and Slack's documented limits (scripts/slack-validate).
#[test]
fn every_payload_passes_block_kit_validation() {
    let dir = tempfile::tempdir().unwrap();
    let huge = "c".repeat(202);
    let ampersands = "&<>".repeat(700);
    let owners =
        serde_json::json!({"team": "t".repeat(3_000), "model": "<m>&".repeat(500)}).to_string();
    let mut files = Vec::new();
    for (n, (cluster, host)) in [
        ("train-east", Some("gpu-node-7")),
        (huge.as_str(), Some(huge.as_str())),
        (ampersands.as_str(), None),
    ]
    .into_iter()
    .enumerate()
    {
        for event in [
            Event::Opened,
            Event::Reminder,
            Event::Resolved,
            Event::StoppedReporting,
        ] {
            // 64 GPUs held by processes with names and labels as long as ingest allows.
            let devices: Vec<gpuledger_core::waste::IdleDevice> = (0..64)
                .map(|g| gpuledger_core::waste::IdleDevice {
                    host: host.unwrap_or(cluster).to_owned(),
                    uuid: format!("GPU-{g}"),
                    index: Some(g),
                    fault: None,
                    processes: vec![gpuledger_core::waste::HeldProcess {
                        gpu_uuid: format!("GPU-{g}"),
                        pid: 1000 + g,
                        name: Some("&<p>".repeat(64)),
                        user: Some("u".repeat(256)),
                        owners: [("team".to_owned(), "<t>&".repeat(64))].into(),
                    }],
                })
                .collect();
            let mut i = incident(cluster, host, &owners);
            i.devices_json = serde_json::to_string(&devices).unwrap();
            // Webhook mode, and app mode with its buttons.
            for interactive in [false, true] {
                let m =
                    incident_message(&i, event, "http://gpuledger.test", 3_600_000, interactive);
                let path = dir
                    .path()
                    .join(format!("{n}-{}-{interactive}.json", event.as_str()));
                std::fs::write(&path, m.to_string()).unwrap();
                files.push(path);
            }
        }
    }
    let path = dir.path().join("test.json");
    std::fs::write(&path, test_message(&huge, &ampersands).to_string()).unwrap();
    files.push(path);
    // A budget on the longest, most hostile key, by spend and by forecast.
    let budget = gpuledger_core::budget::Budget {
        dimension: "cost_center".into(),
        key: "<k>&".repeat(50),
        from_month_ms: 0,
        amount: Decimal::from(1_000_000),
        currency: "EUR".into(),
    };
    let forecast = gpuledger_core::budget::Forecast {
        spent: Decimal::from(900_000),
        expected: Decimal::from(1_200_000),
        low: Decimal::from(1_100_000),
        high: Decimal::from(1_300_000),
        basis_days: 28,
    };
    for basis in [
        gpuledger_core::budget::Basis::Spent,
        gpuledger_core::budget::Basis::Forecast,
    ] {
        let m = budget_message(&budget, &forecast, basis, 90, "2026-11", &ampersands);
        assert!(!m.to_string().contains('$'), "{m}");
        let path = dir.path().join(format!("budget-{}.json", basis.as_str()));
        std::fs::write(&path, m.to_string()).unwrap();
        files.push(path);
    }
    // Anomalies on the same key, spike and new level, with many long drivers.
    use gpuledger_core::anomaly::{AnomalousDay, Anomaly, AnomalyKind, Driver, ProcessSeen};
    let days: Vec<AnomalousDay> = (0..5)
        .map(|i| AnomalousDay {
            day_ms: i * 86_400_000,
            expected: Decimal::from(1_000),
            actual: Decimal::from(9_000),
            partial: i == 4,
        })
        .collect();
    let drivers: Vec<Driver> = (0..5)
        .map(|i| Driver {
            cluster: huge.clone(),
            host: format!("{huge}-{i}"),
            gpus: vec![format!("GPU-{ampersands}"); 8],
            expected: Decimal::from(10),
            actual: Decimal::from(900),
            processes: vec![ProcessSeen {
                name: "<python>&".repeat(40),
                user: Some(ampersands.clone()),
                labels: [("team".to_owned(), "<k>&".repeat(50))].into(),
            }],
        })
        .collect();
    for (kind, n) in [(AnomalyKind::Spike, 1), (AnomalyKind::NewLevel, 5)] {
        let a = Anomaly {
            kind,
            start_ms: 0,
            days: days[..n].to_vec(),
            expected: Decimal::from(1_000 * n as i64),
            actual: Decimal::from(9_000 * n as i64),
        };
        let m = anomaly_message(
            ("cost_center", &budget.key, "EUR"),
            &a,
            &drivers,
            &ampersands,
        );
        assert!(!m.to_string().contains('$'), "{m}");
        let path = dir.path().join(format!("anomaly-{}.json", kind.as_str()));
        std::fs::write(&path, m.to_string()).unwrap();
        files.push(path);
    }
    assert_block_kit_valid(&files);
}

#[test]
fn an_incident_speaks_its_bills_currency() {
    let mut i = incident("train-west", None, "{}");
    i.currency = "EUR".into();
    for event in [Event::Opened, Event::Reminder, Event::Resolved] {
        let m = incident_message(&i, event, "http://gpuledger.test", 3_600_000, false).to_string();
        assert!(m.contains("€2,862.08"), "{m}");
        assert!(!m.contains('$'), "{m}");
    }
    i.currency = "CHF".into();
    let m = incident_message(&i, Event::Opened, "http://gpuledger.test", 0, false).to_string();
    assert!(m.contains("110.08 CHF/h"), "{m}");
}

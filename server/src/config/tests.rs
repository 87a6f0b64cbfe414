use super::*;

const EXAMPLE: &str = r#"
[idle]
threshold_percent = 5
duration = "30m"

[idle.clusters.train-east]
duration = "1h"

[slack]
default_webhook = "https://hooks.slack.com/services/T/B/default"
remind_every = "2h"
base_url = "https://gpuledger.example.com"

[[slack.routes]]
team = "research"
webhook = "https://hooks.slack.com/services/T/B/research"

[[slack.routes]]
name = "train on-call"
cluster = "train-east"
webhook = "https://hooks.slack.com/services/T/B/train"
"#;

#[test]
fn parses_routes_and_overrides() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("gpuledger.toml");
    std::fs::write(&p, EXAMPLE).unwrap();
    let c = Config::load(&p).unwrap();
    assert_eq!(
        c.idle.for_cluster("train-east"),
        (5.0, Duration::from_secs(3600))
    );
    assert_eq!(
        c.idle.for_cluster("other"),
        (5.0, Duration::from_secs(1800))
    );
    assert_eq!(c.idle.longest_duration(), Duration::from_secs(3600));
    let s = &c.slack;
    assert_eq!(
        s.route_for("scratch", &["research".into()]).as_deref(),
        Some("team:research")
    );
    assert_eq!(
        s.route_for("train-east", &[]).as_deref(),
        Some("train on-call")
    );
    assert_eq!(s.route_for("scratch", &[]).as_deref(), Some("default"));
    // Shared with another team: the fleet's, not research's.
    let shared = ["research".to_owned(), "vision".to_owned()];
    assert_eq!(s.route_for("scratch", &shared).as_deref(), Some("default"));
    assert_eq!(
        s.webhook("train on-call"),
        Some("https://hooks.slack.com/services/T/B/train")
    );
    assert!(
        !format!("{c:?}").contains("hooks.slack.com"),
        "webhooks never show in Debug"
    );
    assert_eq!(
        s.labels(),
        vec!["default", "team:research", "train on-call"]
    );
}

#[test]
fn bad_values_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.toml");
    std::fs::write(&p, "[idle]\nthreshold_percent = 150\n").unwrap();
    assert!(Config::load(&p)
        .unwrap_err()
        .to_string()
        .contains("bad.toml"));
    std::fs::write(&p, "[idle]\nduration = \"soon\"\n").unwrap();
    assert!(Config::load(&p).is_err());
    std::fs::write(&p, "[budgets]\nalert_spent_percent = [80, 0]\n").unwrap();
    let e = Config::load(&p).unwrap_err().to_string();
    assert!(
        e.contains("bad.toml") && e.contains("alert percent 0"),
        "{e}"
    );
    std::fs::write(&p, "[budgets]\nalert_forecast_percent = [90, 110]\n").unwrap();
    let c = Config::load(&p).unwrap();
    assert_eq!(
        (
            c.budgets.alert_spent_percent,
            c.budgets.alert_forecast_percent
        ),
        (vec![80, 100], vec![90, 110])
    );
}

#[test]
fn grid_intensities_are_grams_per_kwh_or_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("carbon.toml");
    std::fs::write(
        &p,
        "[carbon]\ndefault_g_per_kwh = 436\n[carbon.clusters]\nonprem = 45.5\n",
    )
    .unwrap();
    let c = Config::load(&p).unwrap();
    assert_eq!(c.carbon.clusters["onprem"], 45.5);
    assert_eq!(c.carbon.default_g_per_kwh, Some(436.0));
    // In t/kWh by mistake (0.000379) is still a number of grams; in mg it is not.
    std::fs::write(&p, "[carbon.regions]\nus-east-1 = 379069\n").unwrap();
    let e = Config::load(&p).unwrap_err().to_string();
    assert!(
        e.contains("carbon.toml") && e.contains("[carbon] regions.us-east-1"),
        "{e}"
    );
    std::fs::write(&p, "[carbon]\ndefault = 400\n").unwrap();
    assert!(Config::load(&p).is_err(), "a misspelt key");
}

#[test]
fn commitment_ends_are_last_days_or_refused_naming_the_commitment() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("commitments.toml");
    let sp = "arn:aws:savingsplans::111122223333:savingsplan/abc";
    std::fs::write(
        &p,
        format!("[commitments.ends]\n\"{sp}\" = \"2027-01-31\"\n"),
    )
    .unwrap();
    let c = Config::load(&p).unwrap();
    // Through the last day: it ends at the next midnight UTC.
    assert_eq!(c.commitments.ends_ms()[sp], 1_801_440_000_000);
    std::fs::write(
        &p,
        format!("[commitments.ends]\n\"{sp}\" = \"31/01/2027\"\n"),
    )
    .unwrap();
    let e = Config::load(&p).unwrap_err().to_string();
    assert!(
        e.contains("commitments.toml") && e.contains(sp) && e.contains("YYYY-MM-DD"),
        "{e}"
    );
}

#[test]
fn a_slack_app_needs_a_secret_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("slack.toml");
    let load = |secret: &str| {
        std::fs::write(&p, format!("[slack.app]\nsigning_secret = \"{secret}\"\n")).unwrap();
        Config::load(&p)
    };
    assert!(load("3f1c2a9b8e7d6c5b4a39281706f5e4d3").is_ok());
    for (secret, says) in [
        ("", "too short"),
        ("abc", "too short"),
        (EXAMPLE_SIGNING_SECRET, "documented example"),
    ] {
        let e = load(secret).unwrap_err().to_string();
        assert!(
            e.contains("slack.toml") && e.contains(says),
            "{secret}: {e}"
        );
    }
}

#[test]
fn exports_need_a_bucket_and_a_format() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("export.toml");
    let load = |text: &str| {
        std::fs::write(&p, text).unwrap();
        Config::load(&p)
    };
    let c = load("[export]\nbucket = \"lake\"\n").unwrap();
    let e = c.export.unwrap();
    assert_eq!(e.formats, [ExportFormat::Csv]);
    assert_eq!((e.catch_up_days, e.settle), (7, Duration::from_secs(7200)));
    assert!(load("").unwrap().export.is_none());
    for (text, says) in [
        ("[export]\nbucket = \" \"\n", "bucket is empty"),
        (
            "[export]\nbucket = \"b\"\nformats = []\n",
            "formats names none",
        ),
        ("[export]\nbucket = \"b\"\nformats = [\"xlsx\"]\n", "xlsx"),
        (
            "[export]\nbucket = \"b\"\ncatch_up_days = 0\n",
            "catch_up_days 0",
        ),
        ("[export]\nbucket = \"b\"\nsettle = \"soon\"\n", "settle"),
    ] {
        let e = load(text).unwrap_err().to_string();
        assert!(e.contains("export.toml") && e.contains(says), "{text}: {e}");
    }
}

#[test]
fn cost_gauge_labels_are_owner_dimensions_and_not_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("metrics.toml");
    let load = |text: &str| {
        std::fs::write(&p, text).unwrap();
        Config::load(&p)
    };
    let c = load("").unwrap();
    assert_eq!(c.metrics.dimensions(&c.owners), ["team", "model"]);
    assert_eq!((c.metrics.max_series, c.metrics.per_gpu), (500, true));
    let c = load("[metrics]\ndimensions = [\"endpoint\"]\nper_gpu = false\n").unwrap();
    assert_eq!(c.metrics.dimensions(&c.owners), ["endpoint"]);
    let e = load("[metrics]\ndimensions = [\"squad\"]\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("metrics.toml") && e.contains("\"squad\""), "{e}");
    let e = load("[owners.state]\n[metrics]\ndimensions = [\"team\", \"state\"]\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("cannot label the gauges"), "{e}");
    let e = load("[metrics]\nmax_series = 3\n").unwrap_err().to_string();
    assert!(e.contains("max_series 3"), "{e}");
}

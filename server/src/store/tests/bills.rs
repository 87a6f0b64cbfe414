use super::*;

fn cost_line(line_no: u64, period: i64, cost: &str) -> gpuledger_core::bill::CostLine {
    let amount = gpuledger_core::money::parse_amount(cost).unwrap();
    gpuledger_core::bill::CostLine {
        line_no,
        provider: "AWS".into(),
        billing_account_id: "1111".into(),
        billing_period_start_ms: period,
        charge_period_start_ms: period + line_no as i64 * 3_600_000,
        charge_period_end_ms: period + (line_no as i64 + 1) * 3_600_000,
        charge_category: "Usage".into(),
        resource_id: Some("arn:aws:ec2:us-east-1:1111:instance/i-0abc".into()),
        resource_key: Some("i-0abc".into()),
        billed_cost: amount,
        effective_cost: amount,
        list_cost: amount,
        currency: "USD".into(),
        pricing_category: "on_demand".into(),
        commitment_discount_id: None,
        commitment_discount_status: None,
        service_name: Some("AmazonEC2".into()),
        sku_id: None,
        region: Some("us-east-1".into()),
        instance_type: Some("p4d.24xlarge".into()),
        tags_json: "{}".into(),
        extra_json: "{}".into(),
    }
}

fn bill_file(
    name: &str,
    sha: &str,
    lines: Vec<gpuledger_core::bill::CostLine>,
) -> crate::billing::BillFile {
    crate::billing::BillFile::Lines {
        source: "focus".into(),
        name: name.into(),
        content_sha256: sha.into(),
        lines,
    }
}

#[tokio::test]
async fn bills_import_once_and_a_newer_export_replaces_its_period() {
    const MAY: i64 = 1_777_593_600_000;
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        let first = vec![
            cost_line(0, MAY, "32.7726"),
            cost_line(1, MAY, "0.000000000000001"),
        ];
        let s1 = crate::billing::store_lines(
            store.as_ref(),
            "focus",
            "may-v1.csv",
            "sha-1".into(),
            first,
            T0,
        )
        .await
        .unwrap();
        assert!(s1.new, "{b}");
        let again = crate::billing::store_lines(
            store.as_ref(),
            "focus",
            "may-v1.csv",
            "sha-1".into(),
            vec![cost_line(0, MAY, "1")],
            T0,
        )
        .await
        .unwrap();
        assert!(!again.new, "{b}: the same content imports once");
        assert_eq!(again.import_id, s1.import_id);

        let lines = crate::store::bills::cost_lines(store.db(), MAY, MAY + 10 * 3_600_000)
            .await
            .unwrap();
        assert_eq!(lines.len(), 2, "{b}");
        assert_eq!(
            lines[1].effective_cost.to_string(),
            "0.000000000000001",
            "{b}: amounts round-trip exactly"
        );

        // A newer export of May: replaces both lines.
        let newer = vec![cost_line(0, MAY, "30")];
        let s2 = crate::billing::store_lines(
            store.as_ref(),
            "focus",
            "may-v2.csv",
            "sha-2".into(),
            newer,
            T0 + 1,
        )
        .await
        .unwrap();
        assert_eq!(s2.replaced_lines, 2, "{b}");
        let lines = crate::store::bills::cost_lines(store.db(), MAY, MAY + 10 * 3_600_000)
            .await
            .unwrap();
        assert_eq!(lines.len(), 1, "{b}");
        assert_eq!(lines[0].effective_cost.to_string(), "30", "{b}");
        let imports = crate::store::bills::billing_imports(store.db())
            .await
            .unwrap();
        assert_eq!(imports.len(), 2, "{b}");
        assert_eq!(
            (imports[0].current_lines, imports[1].current_lines),
            (0, 1),
            "{b}"
        );
        assert_eq!(
            imports[0].totals["USD"].effective.to_string(),
            "32.772600000000001",
            "{b}: an import's totals are as it was imported, replaced or not"
        );

        // Another month is left alone.
        let june = MAY + 31 * 24 * 3_600_000;
        crate::billing::store_lines(
            store.as_ref(),
            "focus",
            "june.csv",
            "sha-3".into(),
            vec![cost_line(0, june, "5")],
            T0 + 2,
        )
        .await
        .unwrap();
        assert_eq!(
            crate::store::bills::cost_lines(store.db(), MAY, june + 3_600_000)
                .await
                .unwrap()
                .len(),
            2,
            "{b}"
        );
    }
}

/// A period in several files: part 2 adds to part 1, a corrected part 1 replaces only part 1,
/// a whole delivery replaces every earlier file, a delivery with a bad file changes nothing,
/// and the billing page's per-file, per-period rows say all of it.
#[tokio::test]
async fn a_period_in_several_files_keeps_every_part_until_it_is_delivered_again() {
    use crate::billing::import_files;
    use crate::store::Replaces::{SameName, WholePeriods};
    use gpuledger_core::bill::FocusError;
    const MAY: i64 = 1_777_593_600_000;
    for db in test_support::both().await {
        let store = db.open().await;
        let s = store.as_ref();
        let b = db.backend;
        let in_force = |lines: Vec<crate::store::StoredCostLine>| {
            let mut costs: Vec<String> = lines
                .into_iter()
                .map(|l| l.effective_cost.to_string())
                .collect();
            costs.sort();
            costs
        };
        let part1 = bill_file(
            "exp-00001.csv",
            "sha-p1",
            vec![cost_line(0, MAY, "10"), cost_line(1, MAY, "20")],
        );
        let part2 = bill_file("exp-00002.csv", "sha-p2", vec![cost_line(0, MAY, "5")]);
        let got = import_files(s, SameName, None, vec![part1], T0)
            .await
            .unwrap();
        assert_eq!((got[0].rows, got[0].replaced_lines), (2, 0), "{b}");
        let got = import_files(s, SameName, None, vec![part2], T0 + 1)
            .await
            .unwrap();
        assert_eq!(
            got[0].replaced_lines, 0,
            "{b}: part 2 never replaces part 1"
        );
        let may = || crate::store::bills::cost_lines(s.db(), MAY, MAY + 10 * 3_600_000);
        assert_eq!(in_force(may().await.unwrap()), ["10", "20", "5"], "{b}");

        // The same file again is a no-op.
        let again = bill_file(
            "exp-00001.csv",
            "sha-p1",
            vec![cost_line(0, MAY, "10"), cost_line(1, MAY, "20")],
        );
        let got = import_files(s, SameName, None, vec![again], T0 + 2)
            .await
            .unwrap();
        assert!(!got[0].new, "{b}");

        // Part 1 corrected: replaces part 1, keeps part 2.
        let fixed = bill_file("exp-00001.csv", "sha-p1b", vec![cost_line(0, MAY, "11")]);
        let got = import_files(s, SameName, None, vec![fixed], T0 + 3)
            .await
            .unwrap();
        assert_eq!(got[0].replaced_lines, 2, "{b}");
        let fixed_id = got[0].import_id;
        assert_eq!(in_force(may().await.unwrap()), ["11", "5"], "{b}");

        // The same lines under another name: a new export of May taken for a part, refused.
        let renamed = bill_file("may-again.csv", "sha-again", vec![cost_line(0, MAY, "11")]);
        match import_files(s, SameName, None, vec![renamed], T0 + 4).await {
            Err(crate::billing::ImportError::Focus {
                file,
                error:
                    FocusError::RepeatsFile {
                        other,
                        repeated,
                        sampled,
                    },
            }) => {
                assert_eq!(
                    (file.as_str(), other.as_str()),
                    ("may-again.csv", "exp-00001.csv"),
                    "{b}"
                );
                assert_eq!((repeated, sampled), (1, 1), "{b}");
            }
            other => panic!("{b}: {other:?}"),
        }
        assert_eq!(in_force(may().await.unwrap()), ["11", "5"], "{b}");

        // A delivery with a bad file stores nothing and replaces nothing.
        let good = bill_file("run2-00001.csv", "sha-r1", vec![cost_line(0, MAY, "1")]);
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(Err(FocusError::Line {
            line: 7,
            message: "broken".into(),
        }))
        .await
        .unwrap();
        drop(tx);
        let bad_lines = rx;
        let (ftx, mut files) = tokio::sync::mpsc::channel(2);
        let good_open = match good {
            crate::billing::BillFile::Lines { lines, .. } => {
                crate::billing::chunks_of(lines.into_iter().map(Ok))
            }
            _ => unreachable!(),
        };
        let import = |name: &str, sha: &str| crate::store::bills::NewImport {
            source: "focus".into(),
            name: name.into(),
            content_sha256: sha.into(),
            imported_ms: T0 + 4,
            delivery: Some("run-2".into()),
        };
        ftx.send((import("run2-00001.csv", "sha-r1"), good_open))
            .await
            .unwrap();
        ftx.send((import("run2-00002.csv", "sha-r2"), bad_lines))
            .await
            .unwrap();
        drop(ftx);
        match crate::billing::import::delivery(s, WholePeriods, &mut files).await {
            Err(StoreError::Rejected { file, .. }) => assert_eq!(file, "run2-00002.csv", "{b}"),
            other => panic!("{b}: {other:?}"),
        }
        assert_eq!(in_force(may().await.unwrap()), ["11", "5"], "{b}");
        assert_eq!(
            crate::store::bills::billing_imports(s.db())
                .await
                .unwrap()
                .len(),
            3,
            "{b}"
        );

        // The whole delivery: every earlier file of May is replaced.
        let run2 = vec![
            bill_file("run2-00001.csv", "sha-r1", vec![cost_line(0, MAY, "1")]),
            bill_file("run2-00002.csv", "sha-r2", vec![cost_line(0, MAY, "2")]),
        ];
        let got = import_files(s, WholePeriods, Some("run-2".into()), run2, T0 + 5)
            .await
            .unwrap();
        assert_eq!(got.iter().map(|g| g.replaced_lines).sum::<u64>(), 2, "{b}");
        assert_eq!(in_force(may().await.unwrap()), ["1", "2"], "{b}");

        let periods = crate::store::bills::billing_file_periods(s.db())
            .await
            .unwrap();
        let row = |name: &str, sha_new: bool| {
            periods
                .iter()
                .filter(|p| p.name == name)
                .find(|p| (p.import_id == fixed_id) == sha_new)
                .cloned()
                .unwrap_or_else(|| panic!("{b}: no row for {name}"))
        };
        let first = row("exp-00001.csv", false);
        assert_eq!(first.replaced_by, Some(fixed_id), "{b}");
        assert_eq!(first.replaced_ms, Some(T0 + 3), "{b}");
        assert_eq!(
            (first.row_count, first.billed_total.as_deref()),
            (2, Some("30")),
            "{b}"
        );
        assert_eq!(row("exp-00001.csv", true).replaced_ms, Some(T0 + 5), "{b}");
        let run = row("run2-00002.csv", false);
        assert_eq!(
            (run.replaced_ms, run.delivery.as_deref()),
            (None, Some("run-2")),
            "{b}"
        );
        assert_eq!(
            periods.iter().filter(|p| p.replaced_ms.is_none()).count(),
            2,
            "{b}"
        );

        // Files imported before per-period totals existed are summed once, when the database
        // is opened (reading them never writes: pages may read from a replica).
        execute_sql(
            &db,
            "UPDATE billing_file_periods SET billed_total = NULL, effective_total = NULL",
        )
        .await;
        let unsummed = crate::store::bills::billing_file_periods(s.db())
            .await
            .unwrap();
        let run = unsummed
            .iter()
            .find(|p| p.name == "run2-00002.csv")
            .unwrap();
        assert_eq!(run.billed_total, None, "{b}");
        let reopened = db.open().await;
        let again = crate::store::bills::billing_file_periods(reopened.db())
            .await
            .unwrap();
        let run = again.iter().find(|p| p.name == "run2-00002.csv").unwrap();
        assert_eq!(run.billed_total.as_deref(), Some("2"), "{b}");
    }
}

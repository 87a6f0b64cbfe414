//! The demo's bill: a FOCUS 1.2 export as AWS Data Exports writes it ("FOCUS 1.2 with AWS
//! columns"), every column FOCUS 1.2 defines filled as AWS fills it.

use rust_decimal::Decimal;

use super::{billed_hourly, fleet, instance_id, DEMO_SAVINGS_PLAN, FORGOTTEN_INSTANCE};
use gpuledger_core::ratecard::RateCard;
use gpuledger_core::time::{month_start_ms, DAY_MS, HOUR_MS};

/// One demo bill line: what differs between lines; the rest is the same for the whole bill.
struct DemoLine<'a> {
    start: i64,
    len: i64,
    billed: Decimal,
    effective: Decimal,
    list_unit: Decimal,
    pricing: &'a str,
    commitment: Option<&'a str>,
    /// The line's part of its commitment: `Used` on a resource it covered, `Unused` on the
    /// commitment itself, none on its purchase.
    commitment_status: Option<&'a str>,
    /// `Usage`, or `Purchase` for a commitment's recurring fee.
    charge: &'a str,
    service: (&'a str, &'a str, &'a str),
    sku: &'a str,
    details: String,
    resource: (String, String, &'a str),
    description: String,
    unit: &'a str,
    /// The resource's tags, as a FOCUS `Tags` JSON object.
    tags: &'a str,
}

/// The bill from `start` until `billed_until`: every GPU host-hour, the savings plan's fee and
/// unused part, a dev box no agent reports, and storage lines that are not GPU hosts.
pub(super) fn focus_bill(card: &RateCard, start: i64, billed_until: i64) -> String {
    let mut w = csv::Writer::from_writer(Vec::new());
    let columns: Vec<&str> = crate::focus_export::COLUMNS
        .iter()
        .copied()
        .filter(|c| !c.starts_with("Allocated"))
        .chain(["x_ServiceCode", "x_UsageType"])
        .collect();
    let _ = w.write_record(&columns);
    let mut row = |l: DemoLine| {
        let _ = w.write_record(columns.iter().map(|c| cell(&l, c)));
    };
    let range = (start, billed_until);
    gpu_host_lines(card, range, &mut row);
    savings_plan_lines(card, range, &mut row);
    devbox_lines(card, range, &mut row);
    storage_lines(range, &mut row);
    w.into_inner()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// Every GPU host-hour, at what the host's pricing charges it.
fn gpu_host_lines(
    card: &RateCard,
    (start, billed_until): (i64, i64),
    row: &mut dyn FnMut(DemoLine),
) {
    for spec in fleet() {
        let (hourly, pricing, status) = billed_hourly(&spec, card);
        let list_unit = card
            .instance_types
            .get(spec.instance_type)
            .map_or(Decimal::ZERO, |r| r.on_demand);
        let commitment = status.map(|_| DEMO_SAVINGS_PLAN);
        let billed = if commitment.is_some() {
            Decimal::ZERO
        } else {
            hourly
        };
        let arn = format!(
            "arn:aws:ec2:us-east-1:111122223333:instance/{}",
            instance_id(&spec)
        );
        let how = match pricing {
            "Dynamic" => "Spot",
            "Committed" => "Savings Plan covered",
            _ => "On Demand",
        };
        let mut t = start;
        while t + HOUR_MS <= billed_until {
            row(DemoLine {
                start: t,
                len: HOUR_MS,
                billed,
                effective: hourly,
                list_unit,
                pricing,
                commitment,
                commitment_status: status,
                charge: "Usage",
                service: (
                    "Compute",
                    "Amazon Elastic Compute Cloud",
                    "Virtual Machines",
                ),
                sku: "DEMOEC2SKU",
                details: format!("{{\"InstanceType\":\"{}\"}}", spec.instance_type),
                resource: (arn.clone(), spec.hostname.clone(), "Instance"),
                description: format!(
                    "${hourly} per {how} Linux {} Instance Hour",
                    spec.instance_type
                ),
                unit: "Hours",
                tags: "{}",
            });
            t += HOUR_MS;
        }
    }
}

/// The savings plan was bought for nine training hosts and one has since been released: its
/// hourly fee is invoiced on the plan itself (a recurring purchase, amortized as usage), and what
/// the eight left of it each hour is its unused part.
fn savings_plan_lines(
    card: &RateCard,
    (start, billed_until): (i64, i64),
    row: &mut dyn FnMut(DemoLine),
) {
    let covered: Decimal = fleet()
        .iter()
        .filter_map(|spec| {
            let (hourly, _, status) = billed_hourly(spec, card);
            status.map(|_| hourly)
        })
        .sum();
    let fee = covered * Decimal::new(1125, 3);
    let plan = (
        DEMO_SAVINGS_PLAN.to_owned(),
        "demo-compute-savings-plan".to_owned(),
        "Savings Plan",
    );
    let mut t = start;
    while t + HOUR_MS <= billed_until {
        for (charge, status, billed, effective, pricing, description) in [
            (
                "Purchase",
                None,
                fee,
                Decimal::ZERO,
                "Standard",
                format!("Savings Plan recurring fee: ${fee} per hour"),
            ),
            (
                "Usage",
                Some("Unused"),
                Decimal::ZERO,
                fee - covered,
                "Committed",
                "Savings Plan commitment not used".to_owned(),
            ),
        ] {
            row(DemoLine {
                start: t,
                len: HOUR_MS,
                billed,
                effective,
                list_unit: billed.max(effective),
                pricing,
                commitment: Some(DEMO_SAVINGS_PLAN),
                commitment_status: status,
                charge,
                service: ("Compute", "Savings Plans for AWS Compute usage", "Other"),
                sku: "DEMOSPSKU",
                details: "{}".into(),
                resource: plan.clone(),
                description,
                unit: "Hours",
                tags: "{}",
            });
        }
        t += HOUR_MS;
    }
}

/// A GPU dev box somebody started and nobody installed the agent on: billed every hour, known
/// only from the bill, its tags saying whose it is.
fn devbox_lines(card: &RateCard, (start, billed_until): (i64, i64), row: &mut dyn FnMut(DemoLine)) {
    let (box_type, box_id) = ("g5.xlarge", FORGOTTEN_INSTANCE);
    let box_rate = card
        .instance_types
        .get(box_type)
        .map_or(Decimal::ZERO, |r| r.on_demand);
    let mut t = start;
    while t + HOUR_MS <= billed_until {
        row(DemoLine {
            start: t,
            len: HOUR_MS,
            billed: box_rate,
            effective: box_rate,
            list_unit: box_rate,
            pricing: "Standard",
            commitment: None,
            commitment_status: None,
            charge: "Usage",
            service: (
                "Compute",
                "Amazon Elastic Compute Cloud",
                "Virtual Machines",
            ),
            sku: "DEMOEC2SKU",
            details: format!("{{\"InstanceType\":\"{box_type}\"}}"),
            resource: (
                format!("arn:aws:ec2:us-east-1:111122223333:instance/{box_id}"),
                "vision-devbox".into(),
                "Instance",
            ),
            description: format!("${box_rate} per On Demand Linux {box_type} Instance Hour"),
            unit: "Hours",
            tags: r#"{"team":"vision","owner":"dana"}"#,
        });
        t += HOUR_MS;
    }
}

/// Shared storage: on the bill, no GPU host's.
fn storage_lines((start, billed_until): (i64, i64), row: &mut dyn FnMut(DemoLine)) {
    let mut t = start;
    while t + DAY_MS <= billed_until {
        let cost = Decimal::new(411_237, 4);
        row(DemoLine {
            start: t,
            len: DAY_MS,
            billed: cost,
            effective: cost,
            list_unit: cost / Decimal::from(24),
            pricing: "Standard",
            commitment: None,
            commitment_status: None,
            charge: "Usage",
            service: ("Storage", "Amazon Simple Storage Service", "Object Storage"),
            sku: "DEMOS3SKU",
            details: "{}".into(),
            resource: (
                "arn:aws:s3:::demo-datasets".into(),
                "demo-datasets".into(),
                "Bucket",
            ),
            description: "$0.023 per GB-Mo for storage used in US East (N. Virginia)".into(),
            unit: "Hours",
            tags: r#"{"team":"data-platform"}"#,
        });
        t += DAY_MS;
    }
}

/// The cell of `col` on line `l`, as AWS fills it.
fn cell(l: &DemoLine, col: &str) -> String {
    let iso = gpuledger_core::time::rfc3339;
    let month_end = |ms: i64| gpuledger_core::time::month_of(ms).1;
    let period = month_start_ms(l.start);
    let quantity = Decimal::from(l.len / HOUR_MS);
    let list = l.list_unit * quantity;
    let text = |d: Decimal| gpuledger_core::money::to_text(d);
    let used = l.commitment.is_some();
    let purchase = l.charge == "Purchase";
    let unused = l.commitment_status == Some("Unused");
    match col {
        "AvailabilityZone" => "us-east-1a".into(),
        "BilledCost" => text(l.billed),
        "BillingAccountId" => "111122223333".into(),
        "BillingAccountName" => "gpuledger-demo-payer".into(),
        "BillingAccountType" => "Billing Account".into(),
        "BillingCurrency" | "PricingCurrency" => "USD".into(),
        "BillingPeriodEnd" => iso(month_end(l.start)),
        "BillingPeriodStart" => iso(period),
        "ChargeCategory" => l.charge.into(),
        "ChargeDescription" => l.description.clone(),
        "ChargeFrequency" if purchase => "Recurring".into(),
        "ChargeFrequency" => "Usage-Based".into(),
        "ChargePeriodEnd" => iso(l.start + l.len),
        "ChargePeriodStart" => iso(l.start),
        "CommitmentDiscountCategory" if used => "Spend".into(),
        "CommitmentDiscountId" => l.commitment.unwrap_or_default().into(),
        "CommitmentDiscountName" if used => "demo-compute-savings-plan".into(),
        "CommitmentDiscountQuantity" if purchase => text(l.billed),
        "CommitmentDiscountQuantity" if used => text(l.effective),
        "CommitmentDiscountStatus" => l.commitment_status.unwrap_or_default().into(),
        "CommitmentDiscountType" if used => "Compute Savings Plan".into(),
        "CommitmentDiscountUnit" if used => "USD".into(),
        // An unused commitment consumed nothing.
        "ConsumedQuantity" | "ConsumedUnit" if unused => String::new(),
        "ConsumedQuantity" | "PricingQuantity" => text(quantity),
        "ConsumedUnit" | "PricingUnit" => l.unit.into(),
        "ContractedCost" if purchase => text(l.billed),
        "ContractedCost" | "PricingCurrencyEffectiveCost" if used => text(l.effective),
        "ContractedCost" => text(list),
        "ContractedUnitPrice" | "PricingCurrencyContractedUnitPrice" if used => {
            text(l.effective / quantity.max(Decimal::ONE))
        }
        "ContractedUnitPrice" | "PricingCurrencyContractedUnitPrice" => text(l.list_unit),
        "PricingCurrencyEffectiveCost" | "EffectiveCost" => text(l.effective),
        // Bought from AWS itself, not through a marketplace: AWS issues the invoice. No
        // invoice id: the simulated months are not invoiced.
        "InvoiceIssuerName" | "PublisherName" => "AWS".into(),
        "ListCost" => text(list),
        "ListUnitPrice" | "PricingCurrencyListUnitPrice" => text(l.list_unit),
        "PricingCategory" => l.pricing.into(),
        "ProviderName" => "AWS".into(),
        "RegionId" => "us-east-1".into(),
        "RegionName" => "US East (N. Virginia)".into(),
        "ResourceId" => l.resource.0.clone(),
        "ResourceName" => l.resource.1.clone(),
        "ResourceType" => l.resource.2.into(),
        "ServiceCategory" => l.service.0.into(),
        "ServiceName" => l.service.1.into(),
        "ServiceSubcategory" => l.service.2.into(),
        "SkuId" => l.sku.into(),
        "SkuMeter" => "Usage".into(),
        "SkuPriceDetails" => l.details.clone(),
        "SkuPriceId" => format!("{}.JRTCKXETXF.6YS6EN2CT7", l.sku),
        "SubAccountId" => "444455556666".into(),
        "SubAccountName" => "ml-platform".into(),
        "SubAccountType" => "Linked Account".into(),
        "Tags" => l.tags.into(),
        "x_ServiceCode" => l.service.1.replace(' ', ""),
        "x_UsageType" => format!("USE1-{}", l.sku),
        _ => String::new(),
    }
}

use super::*;

fn phase(at_s: f64, power_mw: u32) -> Phase {
    Phase {
        at_s,
        power_mw: Some(power_mw),
        ..Default::default()
    }
}

#[test]
fn energy_integrates_power_over_phases() {
    let phases = vec![phase(0.0, 100_000), phase(10.0, 300_000)];
    // 10 s at 100 W, then 5 s at 300 W = 1,000 J + 1,500 J.
    assert_eq!(energy_used_mj(&phases, 0, 15.0), 2_500_000.0);
    assert_eq!(energy_used_mj(&phases, 0, 5.0), 500_000.0);
}

#[test]
fn the_phase_in_force_is_the_latest_started() {
    let phases = vec![phase(0.0, 1), phase(10.0, 2)];
    assert_eq!(phase_at(&phases, 9.9).and_then(|p| p.power_mw), Some(1));
    assert_eq!(phase_at(&phases, 10.0).and_then(|p| p.power_mw), Some(2));
}

fn machine(gpu: &str) -> Result<Machine, String> {
    Machine::parse(&format!(r#"{{"gpus": [{gpu}]}}"#))
}

#[test]
fn mig_instances_are_checked_against_the_models_profiles() {
    let ok = machine(
        r#"{"model": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-1", "mig": [
                {"profile": "3g.40gb", "gpu_instance_id": 1, "compute_instances": [
                    {"compute_instance_id": 0, "slices": 1, "uuid": "MIG-a"},
                    {"compute_instance_id": 1, "slices": 2, "uuid": "MIG-b"}]},
                {"profile": "2g.20gb", "gpu_instance_id": 5, "uuid": "MIG-c"}]}"#,
    )
    .unwrap();
    let mig = &ok.gpus[0].mig;
    assert_eq!(mig.len(), 3);
    assert_eq!(mig[0].name, "NVIDIA A100-SXM4-80GB MIG 1c.3g.40gb");
    assert_eq!(
        (mig[0].multiprocessors(), mig[1].multiprocessors()),
        (14, 28)
    );
    assert_eq!(mig[2].name, "NVIDIA A100-SXM4-80GB MIG 2g.20gb");

    let cases = [
        (
            r#"{"model": "NVIDIA H100 80GB HBM3", "uuid": "G", "mig": [{"profile": "3g.20gb", "gpu_instance_id": 1, "uuid": "M"}]}"#,
            "has no profile \"3g.20gb\"",
        ),
        (
            r#"{"model": "Tesla T4", "uuid": "G", "mig": [{"profile": "1g.5gb", "gpu_instance_id": 1, "uuid": "M"}]}"#,
            "has no MIG",
        ),
        (
            r#"{"model": "NVIDIA A100-SXM4-80GB", "uuid": "G", "mig": [
                    {"profile": "4g.40gb", "gpu_instance_id": 1, "uuid": "M1"},
                    {"profile": "4g.40gb", "gpu_instance_id": 2, "uuid": "M2"}]}"#,
            "need 8 compute",
        ),
        (
            r#"{"model": "NVIDIA A100-SXM4-80GB", "uuid": "G", "mig": [
                    {"profile": "1g.10gb", "gpu_instance_id": 1, "uuid": "M1"},
                    {"profile": "1g.10gb", "gpu_instance_id": 1, "uuid": "M2"}]}"#,
            "id 1 twice",
        ),
        (
            r#"{"model": "NVIDIA B300", "uuid": "G"}"#,
            "not in the catalogue",
        ),
    ];
    for (gpu, want) in cases {
        let e = machine(gpu).unwrap_err();
        assert!(e.contains(want), "{want}: {e}");
    }
}

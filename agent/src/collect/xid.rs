//! What a critical XID means for a GPU's time. NVIDIA's XID catalog sends these to a GPU reset
//! or a reboot: the GPU's time is a fault's until it works again. Every other XID (the
//! application's own, 13, 31, 43, 45, 68, 109; contained errors, 63, 94; warnings such as 92's
//! high single-bit ECC rate; ones this table does not know) is logged and leaves the GPU's time
//! as it reads.

use gpuledger_proto::DeviceFault;

/// XIDs after which the GPU needs a reset or a reboot, in NVIDIA's words.
const NEEDS_RESET: [(u64, &str); 9] = [
    (48, "double-bit ECC error"),
    (62, "internal micro-controller halt"),
    (64, "row remapping failed"),
    (74, "NVLink error"),
    (79, "the GPU has fallen off the bus"),
    (95, "uncontained ECC error"),
    (119, "GSP RPC timeout"),
    (120, "GSP error"),
    (140, "unrecovered ECC error"),
];

/// The fault a critical XID makes, or `None` for one the GPU survives.
pub fn fault(xid: u64) -> Option<DeviceFault> {
    let (_, meaning) = NEEDS_RESET.iter().find(|(x, _)| *x == xid)?;
    Some(DeviceFault {
        code: "xid".into(),
        detail: format!("XID {xid}: {meaning}; the GPU needs a reset"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_xids_that_need_a_reset_are_faults() {
        for survived in [13, 31, 43, 63, 92, 94, 999] {
            assert_eq!(fault(survived), None, "XID {survived}");
        }
        let f = fault(48).unwrap();
        assert_eq!(f.code, "xid");
        assert!(f.detail.contains("double-bit ECC"), "{}", f.detail);
        assert!(gpuledger_proto::DEVICE_FAULT_CODES.contains(&f.code.as_str()));
    }
}

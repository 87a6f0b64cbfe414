//! What a critical XID means for a GPU's time. NVIDIA's device plugin treats XIDs 13, 31, 43, 45,
//! 68 and 109 as the application's own errors (the GPU stays usable); contained ECC errors (94)
//! and recorded row remaps (63) leave it usable too. Every other critical XID needs a reset or a
//! reboot (NVIDIA's XID catalog): the GPU's time is a fault's until work runs on it again.

use gpuledger_proto::DeviceFault;

/// XIDs after which the GPU still works.
const USABLE: [u64; 8] = [13, 31, 43, 45, 63, 68, 94, 109];

/// What the common fatal XIDs mean, in NVIDIA's words.
fn meaning(xid: u64) -> Option<&'static str> {
    Some(match xid {
        48 => "double-bit ECC error",
        62 => "internal micro-controller halt",
        64 => "row remapping failed",
        74 => "NVLink error",
        79 => "the GPU has fallen off the bus",
        92 => "high single-bit ECC error rate",
        95 => "uncontained ECC error",
        119 => "GSP RPC timeout",
        120 => "GSP error",
        140 => "unrecovered ECC error",
        _ => return None,
    })
}

/// The fault a critical XID makes, or `None` for one the GPU survives.
pub fn fault(xid: u64) -> Option<DeviceFault> {
    if USABLE.contains(&xid) {
        return None;
    }
    let detail = match meaning(xid) {
        Some(m) => format!("XID {xid}: {m}; the GPU needs a reset"),
        None => format!("XID {xid}; the GPU needs a reset"),
    };
    Some(DeviceFault {
        code: "xid".into(),
        detail,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn application_xids_leave_the_gpu_usable() {
        assert_eq!(fault(13), None);
        assert_eq!(fault(94), None);
        let f = fault(48).unwrap();
        assert_eq!(f.code, "xid");
        assert!(f.detail.contains("double-bit ECC"), "{}", f.detail);
        assert!(fault(999).unwrap().detail.starts_with("XID 999"));
    }
}

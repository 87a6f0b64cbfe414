//! What each GPU model answers: its NVML name, memory, which calls its driver supports, and the
//! MIG profiles of the models that have MIG.
//!
//! Sources: real `nvidia-smi -q` captures (the test `tests/e2e/nvml_captures.rs` checks the fake
//! against those in `../shared/nvml-captures/`), NVIDIA's NVML reference (`nvml.h`: energy on
//! Volta and newer, GPM on Hopper and newer, no utilization rates or per-process utilization
//! under MIG) and `nvidia-smi mig -lgip` tables (NVIDIA's MIG user guide for A100 and A30, a
//! real p5.48xlarge for H100). Where a number was seen on no real board it says so.

/// GPU architectures, oldest first: what a driver supports is decided by "this or newer".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Arch {
    Pascal,
    Volta,
    Turing,
    Ampere,
    Ada,
    Hopper,
}

/// One GPU model as its driver presents it.
#[derive(Debug)]
pub struct Model {
    /// What `nvmlDeviceGetName` answers.
    pub name: &'static str,
    pub arch: Arch,
    /// `nvmlMemory_v2_t.total`, in MiB.
    pub memory_total_mib: u64,
    /// `nvmlMemory_v2_t.reserved` on a typical driver, in MiB (it varies with driver and ECC
    /// mode; a scenario sets the machine's own).
    pub memory_reserved_mib: u64,
    /// Whether the board has a power sensor (`nvmlDeviceGetPowerUsage`).
    pub power: bool,
    pub mig: Option<&'static MigTable>,
}

impl Model {
    /// `nvmlDeviceGetTotalEnergyConsumption`: Volta and newer.
    pub fn energy(&self) -> bool {
        self.arch >= Arch::Volta
    }

    /// GPU Performance Monitoring: Hopper and newer.
    pub fn gpm(&self) -> bool {
        self.arch >= Arch::Hopper
    }
}

/// A GPU-instance profile as `nvmlDeviceGetGpuInstanceProfileInfo` describes it.
#[derive(Debug)]
pub struct GiProfile {
    /// The `NVML_GPU_INSTANCE_PROFILE_*` constant the caller asks with.
    pub constant: u32,
    /// The driver's profile id (`nvidia-smi mig -lgip`'s ID column), which the call answers.
    pub id: u32,
    pub name: &'static str,
    /// Compute slices (the `Ng` of the name).
    pub slices: u32,
    /// Memory slices it takes (of `MigTable::memory_slices`).
    pub memory_slices: u32,
    /// How many such instances fit on an empty GPU.
    pub instances: u32,
    pub multiprocessors: u32,
    pub memory_mib: u64,
    pub copy_engines: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub jpegs: u32,
    pub ofas: u32,
}

/// A MIG-capable model's geometry and profiles.
#[derive(Debug)]
pub struct MigTable {
    /// Compute slices of the whole GPU: 7 on A100 and H100, 4 on A30.
    pub compute_slices: u32,
    pub memory_slices: u32,
    pub profiles: &'static [GiProfile],
}

impl MigTable {
    pub fn profile_named(&self, name: &str) -> Option<&'static GiProfile> {
        self.profiles.iter().find(|p| p.name == name)
    }

    pub fn profile_by_constant(&self, constant: u32) -> Option<&'static GiProfile> {
        self.profiles.iter().find(|p| p.constant == constant)
    }
}

/// `NVML_GPU_INSTANCE_PROFILE_COUNT` in the NVML 12/13 headers: constants at or past it are
/// refused with `NVML_ERROR_INVALID_ARGUMENT`, so callers know where to stop asking.
pub const GI_PROFILE_COUNT: u32 = 0x12;

const P1: u32 = 0x0;
const P2: u32 = 0x1;
const P3: u32 = 0x2;
const P4: u32 = 0x3;
const P7: u32 = 0x4;
const P1_REV1: u32 = 0x7;
const P2_REV1: u32 = 0x8;
const P1_REV2: u32 = 0x9;

#[allow(clippy::too_many_arguments)]
const fn gi(
    constant: u32,
    id: u32,
    name: &'static str,
    (slices, memory_slices, instances): (u32, u32, u32),
    multiprocessors: u32,
    memory_mib: u64,
    (copy_engines, decoders, encoders, jpegs, ofas): (u32, u32, u32, u32, u32),
) -> GiProfile {
    GiProfile {
        constant,
        id,
        name,
        slices,
        memory_slices,
        instances,
        multiprocessors,
        memory_mib,
        copy_engines,
        decoders,
        encoders,
        jpegs,
        ofas,
    }
}

/// A100 40GB (MIG user guide's `-lgip` listing).
static A100_40GB: MigTable = MigTable {
    compute_slices: 7,
    memory_slices: 8,
    profiles: &[
        gi(P1, 19, "1g.5gb", (1, 1, 7), 14, 4864, (1, 0, 0, 0, 0)),
        gi(
            P1_REV1,
            20,
            "1g.5gb+me",
            (1, 1, 1),
            14,
            4864,
            (1, 1, 0, 1, 1),
        ),
        gi(P1_REV2, 15, "1g.10gb", (1, 2, 4), 14, 9856, (1, 1, 0, 0, 0)),
        gi(P2, 14, "2g.10gb", (2, 2, 3), 28, 9856, (2, 1, 0, 0, 0)),
        gi(P3, 9, "3g.20gb", (3, 4, 2), 42, 19968, (3, 2, 0, 0, 0)),
        gi(P4, 5, "4g.20gb", (4, 4, 1), 56, 19968, (4, 2, 0, 0, 0)),
        gi(P7, 0, "7g.40gb", (7, 8, 1), 98, 40192, (7, 5, 0, 1, 1)),
    ],
};

/// A100 80GB: the same ids and SMs with twice the memory (1g.20gb's 19,968 MiB and 14 SMs as a
/// real A100-SXM4-80GB reports them).
static A100_80GB: MigTable = MigTable {
    compute_slices: 7,
    memory_slices: 8,
    profiles: &[
        gi(P1, 19, "1g.10gb", (1, 1, 7), 14, 9728, (1, 1, 0, 0, 0)),
        gi(
            P1_REV1,
            20,
            "1g.10gb+me",
            (1, 1, 1),
            14,
            9728,
            (1, 1, 0, 1, 1),
        ),
        gi(
            P1_REV2,
            15,
            "1g.20gb",
            (1, 2, 4),
            14,
            19968,
            (1, 1, 0, 0, 0),
        ),
        gi(P2, 14, "2g.20gb", (2, 2, 3), 28, 19968, (2, 1, 0, 0, 0)),
        gi(P3, 9, "3g.40gb", (3, 4, 2), 42, 40192, (3, 2, 0, 0, 0)),
        gi(P4, 5, "4g.40gb", (4, 4, 1), 56, 40192, (4, 2, 0, 0, 0)),
        gi(P7, 0, "7g.80gb", (7, 8, 1), 98, 80640, (7, 5, 0, 1, 1)),
    ],
};

/// A30: four compute slices (MIG user guide's `-lgip` listing).
static A30: MigTable = MigTable {
    compute_slices: 4,
    memory_slices: 4,
    profiles: &[
        gi(P1, 14, "1g.6gb", (1, 1, 4), 14, 5949, (1, 0, 0, 0, 0)),
        gi(
            P1_REV1,
            21,
            "1g.6gb+me",
            (1, 1, 1),
            14,
            5949,
            (1, 1, 0, 1, 1),
        ),
        gi(P2, 5, "2g.12gb", (2, 2, 2), 28, 11971, (2, 2, 0, 0, 0)),
        gi(
            P2_REV1,
            6,
            "2g.12gb+me",
            (2, 2, 1),
            28,
            11971,
            (2, 2, 0, 1, 1),
        ),
        gi(P4, 0, "4g.24gb", (4, 4, 1), 56, 24003, (4, 4, 0, 1, 1)),
    ],
};

/// H100 80GB, from a real p5.48xlarge's `nvidia-smi mig -lgip` (memory there is GiB to two
/// decimals, so these MiB are within 6 MiB). NVIDIA's go-nvml mock differs (48/112 SMs, round
/// memory); real boards are these.
static H100: MigTable = MigTable {
    compute_slices: 7,
    memory_slices: 8,
    profiles: &[
        gi(P1, 19, "1g.10gb", (1, 1, 7), 16, 9984, (1, 1, 0, 1, 0)),
        gi(
            P1_REV1,
            20,
            "1g.10gb+me",
            (1, 1, 1),
            16,
            9984,
            (1, 1, 0, 1, 1),
        ),
        gi(
            P1_REV2,
            15,
            "1g.20gb",
            (1, 2, 4),
            26,
            20091,
            (1, 1, 0, 1, 0),
        ),
        gi(P2, 14, "2g.20gb", (2, 2, 3), 32, 20091, (2, 2, 0, 2, 0)),
        gi(P3, 9, "3g.40gb", (3, 4, 2), 60, 40325, (3, 3, 0, 3, 0)),
        gi(P4, 5, "4g.40gb", (4, 4, 1), 64, 40325, (4, 4, 0, 4, 0)),
        gi(P7, 0, "7g.80gb", (7, 8, 1), 132, 81019, (8, 7, 0, 7, 1)),
    ],
};

/// H200, as a real one's driver (580.159.04) lists it with MIG off (docs/real-gpus.md): the
/// GH100 die of the H100 SXM, so each profile has the H100's SMs and engines, and memory a
/// real H200 gives, below what NVIDIA's go-nvml mock says (18,432 MiB for 1g.18gb, 144,384
/// for 7g.141gb: more than the board's 143,771).
static H200: MigTable = MigTable {
    compute_slices: 7,
    memory_slices: 8,
    profiles: &[
        gi(P1, 19, "1g.18gb", (1, 1, 7), 16, 16384, (1, 1, 0, 1, 0)),
        gi(
            P1_REV1,
            20,
            "1g.18gb+me",
            (1, 1, 1),
            16,
            16384,
            (1, 1, 0, 1, 1),
        ),
        gi(
            P1_REV2,
            15,
            "1g.35gb",
            (1, 2, 4),
            26,
            33280,
            (1, 1, 0, 1, 0),
        ),
        gi(P2, 14, "2g.35gb", (2, 2, 3), 32, 33280, (2, 2, 0, 2, 0)),
        gi(P3, 9, "3g.71gb", (3, 4, 2), 60, 71424, (3, 3, 0, 3, 0)),
        gi(P4, 5, "4g.71gb", (4, 4, 1), 64, 71424, (4, 4, 0, 4, 0)),
        gi(P7, 0, "7g.141gb", (7, 8, 1), 132, 143360, (8, 7, 0, 7, 1)),
    ],
};

const fn model(
    name: &'static str,
    arch: Arch,
    memory_total_mib: u64,
    memory_reserved_mib: u64,
    mig: Option<&'static MigTable>,
) -> Model {
    Model {
        name,
        arch,
        memory_total_mib,
        memory_reserved_mib,
        power: true,
        mig,
    }
}

/// Every model the fake can be. Reserved memory is a capture's where one exists ("seen"),
/// else the nearest board's.
pub static MODELS: &[Model] = &[
    model(
        "NVIDIA A100-SXM4-40GB",
        Arch::Ampere,
        40960,
        634,
        Some(&A100_40GB),
    ),
    model(
        "NVIDIA A100-PCIE-40GB",
        Arch::Ampere,
        40960,
        634,
        Some(&A100_40GB),
    ),
    // Seen: 81,920 total and 869 reserved in MIG mode.
    model(
        "NVIDIA A100-SXM4-80GB",
        Arch::Ampere,
        81920,
        869,
        Some(&A100_80GB),
    ),
    model(
        "NVIDIA A100 80GB PCIe",
        Arch::Ampere,
        81920,
        869,
        Some(&A100_80GB),
    ),
    model("NVIDIA A30", Arch::Ampere, 24576, 496, Some(&A30)),
    // Seen on three 8-GPU hosts: 81,559 total (not 81,920), 551 reserved.
    model(
        "NVIDIA H100 80GB HBM3",
        Arch::Hopper,
        81559,
        551,
        Some(&H100),
    ),
    model("NVIDIA H100 PCIe", Arch::Hopper, 81559, 551, Some(&H100)),
    // Seen: 143,771 total; 644,939,776 bytes reserved (615.06 MiB; nvidia-smi shows 616).
    model("NVIDIA H200", Arch::Hopper, 143771, 615, Some(&H200)),
    // Seen.
    model("NVIDIA A10G", Arch::Ampere, 23028, 435, None),
    model("NVIDIA A10", Arch::Ampere, 23028, 512, None),
    model("NVIDIA L4", Arch::Ada, 23034, 440, None),
    // Seen: a T4 does report power.
    model("Tesla T4", Arch::Turing, 15360, 388, None),
    model("Tesla V100-SXM2-16GB", Arch::Volta, 16384, 310, None),
    model("Tesla V100-SXM2-32GB", Arch::Volta, 32768, 310, None),
    model("NVIDIA TITAN V", Arch::Volta, 12288, 239, None),
    // Pre-Volta: no energy counter.
    model("Tesla P100-PCIE-16GB", Arch::Pascal, 16384, 305, None),
    model("Quadro P2000", Arch::Pascal, 5120, 66, None),
    // Boards without a power sensor: power draw reads N/A.
    Model {
        power: false,
        ..model("Quadro P400", Arch::Pascal, 1998, 0, None)
    },
    Model {
        power: false,
        ..model("GeForce GTX 1070 Ti", Arch::Pascal, 8192, 0, None)
    },
    model("NVIDIA GeForce GTX 1660 Ti", Arch::Turing, 5912, 0, None),
    model("NVIDIA GeForce RTX 3060", Arch::Ampere, 12288, 368, None),
    model("NVIDIA GeForce RTX 3080", Arch::Ampere, 10240, 397, None),
    model("NVIDIA GeForce RTX 3090", Arch::Ampere, 24576, 316, None),
    model("NVIDIA GeForce RTX 4090", Arch::Ada, 24564, 346, None),
    model(
        "NVIDIA RTX 4000 SFF Ada Generation",
        Arch::Ada,
        20475,
        460,
        None,
    ),
];

pub fn model_named(name: &str) -> Option<&'static Model> {
    MODELS.iter().find(|m| m.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mig_table_is_consistent() {
        for m in MODELS {
            let Some(t) = m.mig else { continue };
            for p in t.profiles {
                assert!(p.slices <= t.compute_slices, "{} {}", m.name, p.name);
                assert!(p.memory_slices <= t.memory_slices, "{} {}", m.name, p.name);
                assert!(p.constant < GI_PROFILE_COUNT, "{} {}", m.name, p.name);
                assert!(p.name.starts_with(&format!("{}g.", p.slices)), "{}", p.name);
                assert!(p.memory_mib <= m.memory_total_mib, "{} {}", m.name, p.name);
            }
            let whole = t.profiles.iter().max_by_key(|p| p.slices).unwrap();
            assert_eq!(whole.slices, t.compute_slices, "{}", m.name);
        }
    }
}

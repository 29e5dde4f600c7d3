//! The artifact: one file that holds everything a device needs to run a compiled model.
//!
//! ```text
//! offset  size  field
//!      0     8  magic "KILNART\0"
//!      8     4  format version (little endian), FORMAT_VERSION
//!     12     4  reserved, 0
//!     16     8  manifest length M
//!     24     8  payload length P
//!     32     4  CRC-32 of the manifest and the payload
//!     36    28  reserved, 0 (the header is 64 bytes)
//!     64     M  manifest: UTF-8 JSON (`Manifest`)
//!   64+M     P  payload: blobs (code, constants), each 64-byte aligned, found by `Blob`
//! ```
//!
//! A file that is not an artifact, is truncated, was damaged (the CRC) or has another format
//! version is an error that says which.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{Result, RuntimeError};

pub const MAGIC: &[u8; 8] = b"KILNART\0";
/// 2: kernels have a GPU grid and block, launches say which arguments they write.
pub const FORMAT_VERSION: u32 = 2;
const HEADER: usize = 64;

/// A byte range of the payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blob {
    pub offset: u64,
    pub len: u64,
}

/// What kind of code the artifact carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    /// A shared object for the host CPU (x86-64 Linux).
    Cpu,
    /// PTX for NVIDIA GPUs.
    Cuda,
    /// SPIR-V for OpenCL devices.
    Opencl,
}

impl Target {
    pub fn name(self) -> &'static str {
        match self {
            Target::Cpu => "cpu",
            Target::Cuda => "cuda",
            Target::Opencl => "opencl",
        }
    }
}

/// A tensor the executable takes or returns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorDesc {
    pub name: String,
    /// kiln's dtype name (`f32`, `i64`, `bool`...).
    pub dtype: String,
    pub dims: Vec<usize>,
    /// The buffer holding it.
    pub buffer: usize,
}

/// Where a buffer's bytes live while the executable runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BufferKind {
    /// The caller's i-th input tensor (read only).
    Input(usize),
    /// The i-th output tensor.
    Output(usize),
    /// Constant data from the payload, loaded once.
    Constant(Blob),
    /// A region of the arena, at this byte offset (planned from buffer lifetimes).
    Scratch { offset: u64 },
    /// The same bytes as another buffer, from this byte offset (views: reshape, squeeze...).
    Alias { of: usize, offset: u64 },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufferDesc {
    pub bytes: u64,
    pub kind: BufferKind,
}

/// A compiled kernel: a function in the code blob.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelDesc {
    /// The entry point: the CPU symbol, the PTX `.entry`, the SPIR-V `OpEntryPoint`.
    pub symbol: String,
    /// CPU: how many workgroups one launch of it runs.
    pub workgroups: u64,
    /// What the kernel computes, for profiles and errors (`fc1: Gemm + Relu`).
    pub label: String,
    /// GPU: workgroups (blocks) in x, y, z.
    #[serde(default)]
    pub grid: [u32; 3],
    /// GPU: threads per workgroup in x, y, z.
    #[serde(default)]
    pub block: [u32; 3],
}

/// One launch of a kernel on buffers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launch {
    pub kernel: usize,
    /// Buffer indices, one per kernel argument (GPU: one device pointer each, in this order).
    pub args: Vec<usize>,
    /// Positions in `args` the kernel may write; empty means any of them. Devices that run
    /// launches concurrently order them by what they read and write.
    #[serde(default)]
    pub writes: Vec<usize>,
}

impl Launch {
    /// Whether the argument at `position` may be written.
    pub fn may_write(&self, position: usize) -> bool {
        self.writes.is_empty() || self.writes.contains(&position)
    }
}

/// Everything about a compiled model except the bytes of its code and constants.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The kiln version that wrote it.
    pub kiln_version: String,
    pub model: String,
    pub target: Target,
    /// The CPU features or GPU architecture the code was compiled for, for people.
    pub target_detail: String,
    /// CPU features the code uses (`avx512f`, `fma`...); the runtime refuses a host without one.
    #[serde(default)]
    pub cpu_features: Vec<String>,
    pub inputs: Vec<TensorDesc>,
    pub outputs: Vec<TensorDesc>,
    pub buffers: Vec<BufferDesc>,
    pub kernels: Vec<KernelDesc>,
    /// In order: a valid schedule.
    pub launches: Vec<Launch>,
    /// The code blob: a shared object, PTX text or SPIR-V words.
    pub code: Blob,
    /// Bytes of the scratch arena.
    pub arena_bytes: u64,
}

/// An artifact in memory: its manifest and payload.
#[derive(Clone, Debug)]
pub struct Artifact {
    pub manifest: Manifest,
    pub payload: Vec<u8>,
}

impl Artifact {
    /// The bytes of a blob.
    pub fn blob(&self, b: Blob) -> Result<&[u8]> {
        let (start, end) = (b.offset as usize, (b.offset + b.len) as usize);
        self.payload.get(start..end).ok_or_else(|| RuntimeError::Artifact {
            path: self.manifest.model.clone(),
            msg: format!("blob {start}..{end} lies outside the {}-byte payload", self.payload.len()),
        })
    }

    /// Serialises to the file format.
    pub fn to_bytes(&self) -> Vec<u8> {
        let manifest = serde_json::to_vec(&self.manifest).expect("the manifest serialises");
        let mut crc = crc32fast::Hasher::new();
        crc.update(&manifest);
        crc.update(&self.payload);
        let mut out = Vec::with_capacity(HEADER + manifest.len() + self.payload.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&(manifest.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.payload.len() as u64).to_le_bytes());
        out.extend_from_slice(&crc.finalize().to_le_bytes());
        out.resize(HEADER, 0);
        out.extend_from_slice(&manifest);
        out.extend_from_slice(&self.payload);
        out
    }

    /// Parses the file format; `path` names the file in errors.
    pub fn from_bytes(bytes: &[u8], path: &str) -> Result<Artifact> {
        let bad = |msg: String| RuntimeError::Artifact { path: path.to_string(), msg };
        if bytes.len() < HEADER || &bytes[..8] != MAGIC {
            return Err(bad("not a kiln artifact (no KILNART header); compile a model with `kiln compile`".into()));
        }
        let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        let long = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let version = word(8);
        if version != FORMAT_VERSION {
            return Err(bad(format!("artifact format version {version}, this runtime reads version {FORMAT_VERSION}; recompile the model")));
        }
        let (m, p) = (long(16) as usize, long(24) as usize);
        let want = HEADER.checked_add(m).and_then(|x| x.checked_add(p)).ok_or_else(|| bad("corrupt header (sizes overflow)".into()))?;
        if bytes.len() != want {
            return Err(bad(format!("the file has {} bytes but its header says {want} (truncated or damaged)", bytes.len())));
        }
        let mut crc = crc32fast::Hasher::new();
        crc.update(&bytes[HEADER..]);
        if crc.finalize() != word(32) {
            return Err(bad("checksum mismatch: the file is damaged".into()));
        }
        let manifest: Manifest = serde_json::from_slice(&bytes[HEADER..HEADER + m]).map_err(|e| bad(format!("corrupt manifest: {e}")))?;
        let art = Artifact { manifest, payload: bytes[HEADER + m..].to_vec() };
        art.validate().map_err(bad)?;
        Ok(art)
    }

    pub fn write(&self, path: &Path) -> Result<()> {
        std::fs::write(path, self.to_bytes()).map_err(|e| RuntimeError::Io(format!("{}: {e}", path.display())))
    }

    pub fn read(path: &Path) -> Result<Artifact> {
        let bytes = std::fs::read(path).map_err(|e| RuntimeError::Io(format!("{}: {e}", path.display())))?;
        Artifact::from_bytes(&bytes, &path.display().to_string())
    }

    /// Checks the manifest is self-consistent, so running it cannot index out of bounds.
    pub fn validate(&self) -> std::result::Result<(), String> {
        let m = &self.manifest;
        let nbuf = m.buffers.len();
        let in_payload = |b: &Blob| b.offset.checked_add(b.len).is_some_and(|end| end <= self.payload.len() as u64);
        if !in_payload(&m.code) {
            return Err("the code blob lies outside the payload".into());
        }
        for (i, b) in m.buffers.iter().enumerate() {
            match &b.kind {
                BufferKind::Input(k) if *k >= m.inputs.len() => return Err(format!("buffer {i} is input {k}, of {}", m.inputs.len())),
                BufferKind::Output(k) if *k >= m.outputs.len() => return Err(format!("buffer {i} is output {k}, of {}", m.outputs.len())),
                BufferKind::Constant(blob) if !in_payload(blob) || blob.len < b.bytes => {
                    return Err(format!("buffer {i}'s constant data lies outside the payload"))
                }
                BufferKind::Scratch { offset } if offset.checked_add(b.bytes).is_none_or(|e| e > m.arena_bytes) => {
                    return Err(format!("buffer {i} lies outside the arena"));
                }
                BufferKind::Alias { of, offset } => {
                    let target = m.buffers.get(*of).ok_or_else(|| format!("buffer {i} aliases missing buffer {of}"))?;
                    if matches!(target.kind, BufferKind::Alias { .. }) {
                        return Err(format!("buffer {i} aliases an alias (buffer {of})"));
                    }
                    if offset.checked_add(b.bytes).is_none_or(|end| end > target.bytes) {
                        return Err(format!("buffer {i} aliases bytes outside buffer {of}"));
                    }
                }
                _ => {}
            }
        }
        for t in m.inputs.iter().chain(&m.outputs) {
            if t.buffer >= nbuf {
                return Err(format!("tensor `{}` names missing buffer {}", t.name, t.buffer));
            }
            if kiln_ir::DType::from_name(&t.dtype).is_none() {
                return Err(format!("tensor `{}` has unknown type `{}`", t.name, t.dtype));
            }
        }
        let gpu = matches!(m.target, Target::Cuda | Target::Opencl);
        if gpu {
            for (i, k) in m.kernels.iter().enumerate() {
                if k.grid.contains(&0) || k.block.contains(&0) {
                    return Err(format!(
                        "kernel {i} (`{}`) has grid {:?} and block {:?}; a GPU kernel needs every entry at least 1",
                        k.symbol, k.grid, k.block
                    ));
                }
            }
        }
        for (i, l) in m.launches.iter().enumerate() {
            if l.kernel >= m.kernels.len() {
                return Err(format!("launch {i} names missing kernel {}", l.kernel));
            }
            if let Some(a) = l.args.iter().find(|&&a| a >= nbuf) {
                return Err(format!("launch {i} names missing buffer {a}"));
            }
            if let Some(w) = l.writes.iter().find(|&&w| w >= l.args.len()) {
                return Err(format!("launch {i} writes argument {w}, of {}", l.args.len()));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::hazard::tests::diamond;

    fn art(target: Target) -> Artifact {
        let manifest = diamond(target, 4096, Blob { offset: 0, len: 16 }, Blob { offset: 64, len: 4096 });
        Artifact { manifest, payload: vec![0; 64 + 4096] }
    }

    #[test]
    fn gpu_kernels_need_a_grid_and_a_block() {
        assert_eq!(art(Target::Opencl).validate(), Ok(()));
        for target in [Target::Cuda, Target::Opencl] {
            let mut a = art(target);
            a.manifest.kernels[1].grid = [16, 0, 1];
            let e = a.validate().unwrap_err();
            assert!(e.contains("kernel 1 (`mul`) has grid [16, 0, 1]"), "{e}");
            let mut a = art(target);
            a.manifest.kernels[0].block = [0, 0, 0];
            assert!(a.validate().unwrap_err().contains("needs every entry at least 1"));
        }
        // The CPU ignores them (its artifacts leave them 0).
        let mut a = art(Target::Cpu);
        a.manifest.kernels[0].grid = [0; 3];
        a.manifest.kernels[0].block = [0; 3];
        assert_eq!(a.validate(), Ok(()));
    }

    #[test]
    fn writes_name_arguments_of_the_launch() {
        let mut a = art(Target::Cuda);
        a.manifest.launches[3].writes = vec![2, 3];
        assert_eq!(a.validate().unwrap_err(), "launch 3 writes argument 3, of 3");
        // Through the file format, as a reader meets it.
        let e = Artifact::from_bytes(&a.to_bytes(), "m.kiln").unwrap_err().to_string();
        assert_eq!(e, "m.kiln: launch 3 writes argument 3, of 3");
    }

    #[test]
    fn gpu_fields_round_trip_and_default_when_absent() {
        let a = art(Target::Opencl);
        let back = Artifact::from_bytes(&a.to_bytes(), "m.kiln").unwrap();
        assert_eq!(back.manifest, a.manifest);
        let k: KernelDesc = serde_json::from_str(r#"{"symbol":"k0","workgroups":4,"label":"x"}"#).unwrap();
        assert_eq!((k.grid, k.block), ([0; 3], [0; 3]));
        let l: Launch = serde_json::from_str(r#"{"kernel":0,"args":[1,2]}"#).unwrap();
        assert!(l.writes.is_empty() && l.may_write(0) && l.may_write(1));
    }

    #[test]
    fn older_format_versions_are_refused() {
        let mut bytes = art(Target::Cpu).to_bytes();
        bytes[8..12].copy_from_slice(&1u32.to_le_bytes());
        let e = Artifact::from_bytes(&bytes, "old.kiln").unwrap_err().to_string();
        assert!(e.contains("artifact format version 1, this runtime reads version 2; recompile the model"), "{e}");
    }
}

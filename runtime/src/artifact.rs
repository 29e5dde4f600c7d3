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
pub const FORMAT_VERSION: u32 = 1;
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
    /// The symbol (CPU) or entry point (GPU).
    pub symbol: String,
    /// How many workgroups one launch of it runs.
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
    /// Buffer ids, one per kernel argument.
    pub args: Vec<usize>,
    /// Positions in `args` the kernel may write; empty: any.
    #[serde(default)]
    pub writes: Vec<usize>,
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
    fn validate(&self) -> std::result::Result<(), String> {
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
        for (i, l) in m.launches.iter().enumerate() {
            if l.kernel >= m.kernels.len() {
                return Err(format!("launch {i} names missing kernel {}", l.kernel));
            }
            if let Some(a) = l.args.iter().find(|&&a| a >= nbuf) {
                return Err(format!("launch {i} names missing buffer {a}"));
            }
        }
        Ok(())
    }
}

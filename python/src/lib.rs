//! `kiln._kiln`, the native half of kiln's Python package: sessions over `kiln_compiler::Session`
//! (an ONNX model, compiled for the sizes each run brings) or a loaded artifact, and `compile`,
//! `load`, `emit` and `devices`. numpy arrays in and out: a C-contiguous input aligned to 8
//! bytes is read where it lies (the array is kept alive for the run), and the GIL is released
//! while the kernels run. The Python half (`kiln/__init__.py`) gives the onnxruntime-style names.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use kiln_compiler::{CompileError, Options, Session, TargetKind};
use kiln_ir::{DType, Dim, Graph, Tensor};
use kiln_runtime::{Artifact, Executable, LoadOptions, Profile, RuntimeError};
use numpy::{PyArray, PyArrayDescrMethods, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

mod training;

create_exception!(
    _kiln,
    KilnError,
    PyException,
    "An error kiln reports: a model it cannot import or compile, a wrong input, a missing device."
);

/// kiln's message with its causes, as the CLI prints them.
fn message(e: &(dyn std::error::Error + 'static)) -> String {
    kiln_compiler::error_chain(e)
}

fn compile_err(e: CompileError) -> PyErr {
    KilnError::new_err(message(&e))
}

fn runtime_err(e: RuntimeError) -> PyErr {
    KilnError::new_err(message(&e))
}

/// A model given as a path or as bytes: an ONNX model or a compiled artifact (told apart by the
/// artifact's magic bytes).
enum Model {
    Graph(Graph),
    Artifact(Box<Artifact>),
}

/// A model's bytes, the folder its external data is read from (a path's), and its name in
/// messages.
fn model_bytes(
    model: &Bound<'_, PyAny>,
) -> PyResult<(Vec<u8>, Option<std::path::PathBuf>, String)> {
    Ok(if let Ok(b) = model.cast::<PyBytes>() {
        (b.as_bytes().to_vec(), None, "<bytes>".to_string())
    } else {
        let path: std::path::PathBuf = model
            .extract()
            .map_err(|_| KilnError::new_err("a model is a path (str or os.PathLike) or bytes"))?;
        let bytes = std::fs::read(&path)
            .map_err(|e| KilnError::new_err(format!("{}: {e}", path.display())))?;
        let dir = path.parent().map(|p| {
            if p.as_os_str().is_empty() {
                Path::new(".").to_path_buf()
            } else {
                p.to_path_buf()
            }
        });
        (bytes, dir, path.display().to_string())
    })
}

fn read_model(model: &Bound<'_, PyAny>) -> PyResult<Model> {
    let (bytes, dir, label) = model_bytes(model)?;
    if bytes.starts_with(kiln_runtime::artifact::MAGIC) {
        return Ok(Model::Artifact(Box::new(
            Artifact::from_bytes(&bytes, &label).map_err(runtime_err)?,
        )));
    }
    let m = kiln_ir::onnx::load_bytes(&bytes, dir.as_deref())
        .map_err(|e| KilnError::new_err(format!("{label}: {}", message(&e))))?;
    Ok(Model::Graph(m.graph))
}

fn target_of(name: &str) -> PyResult<TargetKind> {
    name.parse()
        .map_err(|_| KilnError::new_err(format!("unknown target `{name}` (cpu, cuda or opencl)")))
}

/// The target to compile for on `device`: `auto` takes a CUDA GPU, else an OpenCL GPU, else the
/// CPU, as `kiln run` does.
fn device_target(device: &str) -> PyResult<TargetKind> {
    if device != "auto" {
        return target_of(device);
    }
    Ok(kiln_runtime::auto_device().0)
}

fn options_for(
    target: TargetKind,
    shapes: Option<HashMap<String, Vec<usize>>>,
    precision: &str,
) -> PyResult<Options> {
    let precision = precision
        .parse()
        .map_err(|e: String| compile_err(kiln_compiler::CompileError::Usage(e)))?;
    Ok(Options {
        input_shapes: shapes.unwrap_or_default(),
        precision,
        ..Options::for_target(target)
    })
}

/// One input or output as a session declares it: a name, an ONNX-style type and a shape whose
/// symbolic sizes are their names.
#[derive(Clone)]
struct Port {
    name: String,
    dtype: DType,
    shape: Vec<Result<usize, String>>,
}

impl Port {
    fn to_py<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let shape = PyList::empty(py);
        for d in &self.shape {
            match d {
                Ok(n) => shape.append(n)?,
                Err(s) => shape.append(s)?,
            }
        }
        (self.name.as_str(), onnx_type(self.dtype), shape).into_pyobject(py).map(|t| t.into_any())
    }
}

/// onnxruntime's type names.
fn onnx_type(d: DType) -> &'static str {
    match d {
        DType::F32 => "tensor(float)",
        DType::F64 => "tensor(double)",
        DType::F16 => "tensor(float16)",
        DType::BF16 => "tensor(bfloat16)",
        DType::I8 => "tensor(int8)",
        DType::I16 => "tensor(int16)",
        DType::I32 => "tensor(int32)",
        DType::I64 => "tensor(int64)",
        DType::U8 => "tensor(uint8)",
        DType::U16 => "tensor(uint16)",
        DType::U32 => "tensor(uint32)",
        DType::U64 => "tensor(uint64)",
        DType::Bool => "tensor(bool)",
        DType::F8E4M3FN => "tensor(float8e4m3fn)",
        DType::F8E4M3FNUZ => "tensor(float8e4m3fnuz)",
        DType::F8E5M2 => "tensor(float8e5m2)",
        DType::F8E5M2FNUZ => "tensor(float8e5m2fnuz)",
        DType::F8E8M0 => "tensor(float8e8m0)",
        DType::F4E2M1 => "tensor(float4e2m1)",
        DType::I4 => "tensor(int4)",
        DType::U4 => "tensor(uint4)",
        DType::I2 => "tensor(int2)",
        DType::U2 => "tensor(uint2)",
        DType::String => "tensor(string)",
    }
}

/// The storage type of an ml_dtypes name.
fn storage_of(name: &str) -> Option<DType> {
    DType::ALL.into_iter().find(|&d| ml_dtype(d).is_some_and(|(n, _)| n == name))
}

/// ml_dtypes' name of a storage type (one byte an element there too), and the numpy type its
/// values widen to without ml_dtypes.
fn ml_dtype(d: DType) -> Option<(&'static str, DType)> {
    Some(match d {
        DType::F8E4M3FN => ("float8_e4m3fn", DType::F32),
        DType::F8E4M3FNUZ => ("float8_e4m3fnuz", DType::F32),
        DType::F8E5M2 => ("float8_e5m2", DType::F32),
        DType::F8E5M2FNUZ => ("float8_e5m2fnuz", DType::F32),
        DType::F8E8M0 => ("float8_e8m0fnu", DType::F32),
        DType::F4E2M1 => ("float4_e2m1fn", DType::F32),
        DType::I4 => ("int4", DType::I8),
        DType::U4 => ("uint4", DType::U8),
        DType::I2 => ("int2", DType::I8),
        DType::U2 => ("uint2", DType::U8),
        _ => return None,
    })
}

fn graph_ports(g: &Graph) -> PyResult<(Vec<Port>, Vec<Port>)> {
    let port = |name: &str, ty: &kiln_ir::TensorType| -> PyResult<Port> {
        if !ty.kind.is_tensor() {
            return Err(KilnError::new_err(format!("`{name}` is {ty}: sequences and optionals are not supported from Python yet (use `kiln run`)")));
        }
        let shape = ty.shape.dims().iter().map(|d| match d {
            Dim::Fixed(n) => Ok(*n),
            Dim::Sym(s) => Err(s.to_string()),
        });
        Ok(Port { name: name.to_string(), dtype: ty.dtype, shape: shape.collect() })
    };
    let inputs = g
        .inputs()
        .iter()
        .map(|&id| port(&g.node(id).name, &g.node(id).outputs[0]))
        .collect::<PyResult<_>>()?;
    let outputs =
        g.outputs().iter().map(|(n, v)| port(n, g.value_type(*v))).collect::<PyResult<_>>()?;
    Ok((inputs, outputs))
}

fn artifact_ports(exe: &Executable) -> (Vec<Port>, Vec<Port>) {
    let batch = exe.manifest().batch.as_ref().map(|b| b.symbol.clone());
    let port = |d: &kiln_runtime::artifact::TensorDesc, batched: bool| Port {
        name: d.name.clone(),
        dtype: DType::from_name(&d.dtype).unwrap_or(DType::F32),
        shape: d
            .dims
            .iter()
            .enumerate()
            .map(|(i, &n)| match (&batch, i) {
                (Some(s), 0) if batched => Err(s.clone()),
                _ => Ok(n),
            })
            .collect(),
    };
    (
        exe.inputs().iter().map(|d| port(d, true)).collect(),
        exe.outputs().iter().map(|d| port(d, true)).collect(),
    )
}

/// What a session runs: one loaded program (an artifact, or a model whose sizes are all known),
/// or a `kiln_compiler::Session` that compiles per size.
enum Engine {
    Fixed(Box<Executable>),
    Sized(Box<Mutex<Session>>),
}

impl Engine {
    fn run(&self, inputs: &[Tensor], profile: Option<&mut Profile>) -> Result<Vec<Tensor>, String> {
        match self {
            Engine::Fixed(exe) => exe.run_profiled(inputs, profile).map_err(|e| message(&e)),
            Engine::Sized(s) => s
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .run_profiled(inputs, profile)
                .map_err(|e| message(&e)),
        }
    }
}

/// A model ready to run: `Session(model, device="auto", threads=None, profile=False)`.
#[pyclass(module = "kiln._kiln", name = "Session", frozen)]
struct PySession {
    engine: Engine,
    inputs: Vec<Port>,
    outputs: Vec<Port>,
    device: String,
    profiling: bool,
    last_profile: Mutex<Option<Profile>>,
}

impl PySession {
    fn from_model(
        model: Model,
        device: &str,
        threads: Option<usize>,
        profiling: bool,
        precision: &str,
    ) -> PyResult<PySession> {
        let load = LoadOptions { threads, ..Default::default() };
        match model {
            Model::Artifact(_) if precision != "f32" => Err(KilnError::new_err(format!(
                "precision=\"{precision}\" applies when compiling: compile the model with it (kiln.compile(model, precision=\"{precision}\")), or load the ONNX model"
            ))),
            Model::Artifact(a) => {
                let compiled_for = a.manifest.target.name();
                if device != "auto" && device != compiled_for {
                    return Err(KilnError::new_err(format!("this artifact was compiled for {compiled_for}; load it with device=\"{compiled_for}\"")));
                }
                let exe = Executable::load(*a, &load).map_err(runtime_err)?;
                let (inputs, outputs) = artifact_ports(&exe);
                let device = exe.device();
                Ok(PySession {
                    engine: Engine::Fixed(Box::new(exe)),
                    inputs,
                    outputs,
                    device,
                    profiling,
                    last_profile: Mutex::new(None),
                })
            }
            Model::Graph(g) => {
                let (inputs, outputs) = graph_ports(&g)?;
                let options = options_for(device_target(device)?, None, precision)?;
                // A model whose sizes are all known compiles now; one with symbolic sizes or
                // shape-deciding inputs, on the first run of each size.
                let fixed = inputs.iter().all(|p| p.shape.iter().all(Result::is_ok))
                    && kiln_compiler::passes::specialize::shape_inputs(&g).is_empty();
                let cpu_threads = load.cpu_threads();
                let engine = if fixed {
                    Engine::Fixed(Box::new(
                        kiln_compiler::jit(&g, &options, &load).map_err(compile_err)?,
                    ))
                } else {
                    Engine::Sized(Box::new(Mutex::new(Session::new(g, options.clone(), load))))
                };
                let device = match &engine {
                    Engine::Fixed(exe) => exe.device(),
                    // The device is chosen at the first run; the CPU's threads are known now.
                    Engine::Sized(_) if options.target == TargetKind::Cpu => {
                        kiln_runtime::cpu_description(cpu_threads)
                    }
                    Engine::Sized(_) => options.target.name().to_string(),
                };
                Ok(PySession {
                    engine,
                    inputs,
                    outputs,
                    device,
                    profiling,
                    last_profile: Mutex::new(None),
                })
            }
        }
    }
}

/// A numpy array as a tensor of its own dtype: read where it lies when C-contiguous and aligned
/// to 8 bytes (the array stays alive as long as the tensor), else copied.
fn tensor_of(py: Python<'_>, name: &str, want: DType, obj: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    if want.is_string() {
        return strings_of(py, name, obj);
    }
    let arr = match obj.cast::<PyUntypedArray>() {
        Ok(a) => a.clone(),
        Err(_) => {
            // A list (or any sequence or scalar) becomes an array of the type the input
            // declares, as onnxruntime takes it: [1.5, 2] is not a float64 input.
            let np = py.import("numpy")?;
            let converted = match numpy_name(want) {
                Some(t) => np.call_method1("asarray", (obj, t)),
                None => np.call_method1("asarray", (obj,)),
            };
            converted?
                .cast_into::<PyUntypedArray>()
                .map_err(|_| KilnError::new_err(format!("input `{name}`: not an array")))?
        }
    };
    let descr = arr.dtype();
    let storage = if descr.itemsize() == 1 { storage_of(&descr.str()?.to_string()) } else { None };
    let dtype = match (descr.kind(), descr.itemsize()) {
        (b'f', 4) => DType::F32,
        (b'f', 8) => DType::F64,
        (b'f', 2) => DType::F16,
        (b'i', 1) => DType::I8,
        (b'i', 2) => DType::I16,
        (b'i', 4) => DType::I32,
        (b'i', 8) => DType::I64,
        (b'u', 1) => DType::U8,
        (b'u', 2) => DType::U16,
        (b'u', 4) => DType::U32,
        (b'u', 8) => DType::U64,
        (b'b', 1) => DType::Bool,
        // ml_dtypes' bfloat16 (what onnx's numpy_helper gives).
        (b'V', 2) if descr.str()? == "bfloat16" => DType::BF16,
        // ml_dtypes' 8- and 4-bit floats and 4- and 2-bit integers, a byte each as in kiln.
        (_, 1) if let Some(d) = storage => d,
        _ => {
            return Err(KilnError::new_err(format!(
                "input `{name}`: numpy dtype {} has no kiln type",
                descr.str()?
            )))
        }
    };
    if dtype != want {
        return Err(KilnError::new_err(format!(
            "input `{name}`: expected {} ({}), got numpy {}",
            want.name(),
            onnx_type(want),
            descr.str()?
        )));
    }
    let arr = if descr.byteorder() == b'>' {
        // Big-endian values (kiln's hosts are little-endian): converted, not reinterpreted.
        let native = descr.call_method1("newbyteorder", ("=",))?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("order", "C")?;
        arr.call_method("astype", (native,), Some(&kwargs))?.cast_into::<PyUntypedArray>()?
    } else if arr.is_c_contiguous() {
        arr
    } else {
        py.import("numpy")?
            .call_method1("ascontiguousarray", (&arr,))?
            .cast_into::<PyUntypedArray>()?
    };
    let dims: Vec<usize> = arr.shape().to_vec();
    let len = arr.len() * dtype.size();
    // SAFETY: a C-contiguous array has `len` bytes at its data pointer, which the array (kept
    // alive by the tensor) owns; numpy bools are 0 or 1.
    let ptr = unsafe { (*arr.as_array_ptr()).data as *const u8 };
    let owner: Py<PyAny> = arr.clone().into_any().unbind();
    if let Some(t) = unsafe { Tensor::from_external(dtype, &dims, ptr, len, Box::new(owner)) } {
        return Ok(t);
    }
    // SAFETY: as above; copied at once.
    let bytes = if len == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(ptr, len) } };
    Tensor::from_bytes(dtype, &dims, bytes)
        .map_err(|e| KilnError::new_err(format!("input `{name}`: {e}")))
}

/// A string input as onnxruntime takes it: a numpy array of str objects (dtype object) or of
/// fixed-width str (`<U`), or a (nested) list of str; bytes must be UTF-8.
fn strings_of(py: Python<'_>, name: &str, obj: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    let bad = |what: String| KilnError::new_err(format!("input `{name}`: {what}"));
    let arr = py.import("numpy")?.call_method1("asarray", (obj, "O"))?;
    let dims: Vec<usize> = arr.getattr("shape")?.extract()?;
    let items = arr.call_method0("ravel")?.call_method0("tolist")?;
    let mut strings = Vec::new();
    for item in items.try_iter()? {
        let item = item?;
        let s = match item.extract::<String>() {
            Ok(s) => s,
            Err(_) => match item.extract::<Vec<u8>>() {
                Ok(b) if item.is_instance_of::<pyo3::types::PyBytes>() => {
                    String::from_utf8(b).map_err(|_| bad("a bytes element is not UTF-8".into()))?
                }
                _ => return Err(bad(format!("expected strings, got {}", item.get_type().name()?))),
            },
        };
        strings.push(s);
    }
    Tensor::from_strings(&dims, strings).map_err(|e| bad(e.to_string()))
}

/// numpy's name for a kiln type with a numpy type of its own.
fn numpy_name(d: DType) -> Option<&'static str> {
    Some(match d {
        DType::F32 => "float32",
        DType::F64 => "float64",
        DType::F16 => "float16",
        DType::I8 => "int8",
        DType::I16 => "int16",
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::U8 => "uint8",
        DType::U16 => "uint16",
        DType::U32 => "uint32",
        DType::U64 => "uint64",
        DType::Bool => "bool",
        _ => return None,
    })
}

/// A tensor as a new numpy array.
fn array_of<'py>(py: Python<'py>, t: &Tensor) -> PyResult<Bound<'py, PyAny>> {
    fn copy<'py, T: numpy::Element + bytemuck_like::Pod>(
        py: Python<'py>,
        t: &Tensor,
    ) -> PyResult<Bound<'py, PyAny>> {
        // SAFETY: the new array is written whole before Python sees it.
        let a = unsafe { PyArray::<T, _>::new(py, t.dims().to_vec(), false) };
        let dst = unsafe { a.as_slice_mut() }.map_err(|e| KilnError::new_err(e.to_string()))?;
        let src = t.bytes();
        // SAFETY: `dst` is `src.len()` bytes of plain data.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr() as *mut u8, src.len())
        };
        Ok(a.into_any())
    }
    match t.dtype() {
        DType::F32 => copy::<f32>(py, t),
        DType::F64 => copy::<f64>(py, t),
        DType::F16 => copy::<kiln_ir::f16>(py, t),
        // numpy has no bfloat16: ml_dtypes' when it is installed, else float32.
        DType::BF16 => match py.import("ml_dtypes") {
            Ok(ml) => copy::<u16>(py, t)?.call_method1("view", (ml.getattr("bfloat16")?,)),
            Err(_) => copy::<f32>(py, &t.cast(DType::F32)),
        },
        DType::I8 => copy::<i8>(py, t),
        DType::I16 => copy::<i16>(py, t),
        DType::I32 => copy::<i32>(py, t),
        DType::I64 => copy::<i64>(py, t),
        DType::U8 => copy::<u8>(py, t),
        DType::U16 => copy::<u16>(py, t),
        DType::U32 => copy::<u32>(py, t),
        DType::U64 => copy::<u64>(py, t),
        DType::Bool => copy::<bool>(py, t),
        // Strings as onnxruntime gives them: a numpy array of Python str objects.
        DType::String => {
            let items = PyList::new(py, t.strings().unwrap_or_default())?;
            let flat = py.import("numpy")?.call_method1("array", (items, "O"))?;
            flat.call_method1("reshape", (t.dims().to_vec(),))
        }
        DType::F8E4M3FN
        | DType::F8E4M3FNUZ
        | DType::F8E5M2
        | DType::F8E5M2FNUZ
        | DType::F8E8M0
        | DType::F4E2M1
        | DType::I4
        | DType::U4
        | DType::I2
        | DType::U2 => {
            let (name, wide) = ml_dtype(t.dtype()).expect("a storage type");
            match py.import("ml_dtypes").and_then(|ml| ml.getattr(name)) {
                Ok(ty) => copy::<u8>(py, t)?.call_method1("view", (ty,)),
                Err(_) if wide == DType::F32 => copy::<f32>(py, &t.cast(DType::F32)),
                Err(_) if wide == DType::I8 => copy::<i8>(py, &t.cast(DType::I8)),
                Err(_) => copy::<u8>(py, &t.cast(DType::U8)),
            }
        }
    }
}

/// Element types whose bytes any pattern of the tensor's fills (kiln's bools are 0 or 1).
mod bytemuck_like {
    pub trait Pod {}
    macro_rules! pod {
        ($($t:ty),*) => { $(impl Pod for $t {})* };
    }
    pod!(f32, f64, kiln_ir::f16, i8, i16, i32, i64, u8, u16, u32, u64, bool);
}

#[pymethods]
impl PySession {
    #[new]
    #[pyo3(signature = (model, device = "auto", threads = None, profile = false, precision = "f32"))]
    fn new(
        model: &Bound<'_, PyAny>,
        device: &str,
        threads: Option<usize>,
        profile: bool,
        precision: &str,
    ) -> PyResult<PySession> {
        let m = read_model(model)?;
        let py = model.py();
        py.detach(|| PySession::from_model(m, device, threads, profile, precision))
    }

    /// (name, type, shape) per input; a symbolic size is its name.
    fn inputs<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyAny>>> {
        self.inputs.iter().map(|p| p.to_py(py)).collect()
    }

    fn outputs<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyAny>>> {
        self.outputs.iter().map(|p| p.to_py(py)).collect()
    }

    /// Where it runs: `cpu (2 threads)`, an OpenCL or CUDA device's name.
    #[getter]
    fn device(&self) -> String {
        self.device.clone()
    }

    /// Runs on `feeds` (name -> array) and returns the outputs named (all when `None`), in order.
    #[pyo3(signature = (output_names, feeds))]
    fn run<'py>(
        &self,
        py: Python<'py>,
        output_names: Option<Vec<String>>,
        feeds: &Bound<'py, PyDict>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let expected = || {
            self.inputs
                .iter()
                .map(|p| format!("{}: {}", p.name, onnx_type(p.dtype)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let unknown = || -> PyResult<()> {
            for (k, _) in feeds.iter() {
                let k: String =
                    k.extract().map_err(|_| KilnError::new_err("input names are strings"))?;
                if !self.inputs.iter().any(|p| p.name == k) {
                    return Err(KilnError::new_err(format!(
                        "the model has no input `{k}`; it takes {}",
                        expected()
                    )));
                }
            }
            Ok(())
        };
        if feeds.len() != self.inputs.len() {
            unknown()?;
        }
        let mut tensors = Vec::with_capacity(self.inputs.len());
        for p in &self.inputs {
            let Some(v) = feeds.get_item(&p.name)? else {
                unknown()?;
                return Err(KilnError::new_err(format!(
                    "missing input `{}`; the model takes {}",
                    p.name,
                    expected()
                )));
            };
            tensors.push(tensor_of(py, &p.name, p.dtype, &v)?);
        }
        let picked: Vec<usize> = match &output_names {
            None => (0..self.outputs.len()).collect(),
            Some(names) => names
                .iter()
                .map(|n| {
                    self.outputs.iter().position(|p| &p.name == n).ok_or_else(|| {
                        let all: Vec<&str> = self.outputs.iter().map(|p| p.name.as_str()).collect();
                        KilnError::new_err(format!(
                            "the model has no output `{n}`; its outputs are {}",
                            all.join(", ")
                        ))
                    })
                })
                .collect::<PyResult<_>>()?,
        };
        let mut profile = self.profiling.then(Profile::default);
        let result = py.detach(|| self.engine.run(&tensors, profile.as_mut()));
        drop(tensors);
        let outs = result.map_err(KilnError::new_err)?;
        if let Some(p) = profile {
            *self.last_profile.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
        }
        picked.into_iter().map(|i| array_of(py, &outs[i])).collect()
    }

    /// The last run's profile: per-kernel (label, seconds), and the bytes copied to and from the
    /// device. Needs `profile=True`.
    fn profile<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if !self.profiling {
            return Err(KilnError::new_err(
                "profiling is off: create the session with profile=True",
            ));
        }
        let guard = self.last_profile.lock().unwrap_or_else(|e| e.into_inner());
        let p = guard.as_ref().ok_or_else(|| KilnError::new_err("no run has been profiled yet"))?;
        let d = PyDict::new(py);
        let launches: Vec<(String, f64)> = p
            .launches
            .iter()
            .map(|(l, t): &(String, Duration)| (l.clone(), t.as_secs_f64()))
            .collect();
        d.set_item("launches", launches)?;
        d.set_item("bytes_to_device", p.bytes_to_device)?;
        d.set_item("bytes_from_device", p.bytes_from_device)?;
        Ok(d)
    }
}

/// Compiles `model` for `target` and returns the artifact's bytes (also written to `output`,
/// atomically, when given). `input_shapes` fixes symbolic sizes (name -> dims); without them a
/// symbolic batch gives an artifact for any batch. `max_size` (`{"symbol": n}`, one symbol)
/// compiles a symbol padded to `n`, so one program runs every size up to it (`kiln compile
/// --max-size`); `cuda_arch` the GPU architecture for `target="cuda"` (default sm_80).
#[pyfunction]
#[pyo3(signature = (model, target = "cpu", output = None, input_shapes = None, precision = "f32", max_size = None, cuda_arch = None, target_cpu = "native"))]
#[allow(clippy::too_many_arguments)] // the CLI's options, by name from Python
fn compile<'py>(
    py: Python<'py>,
    model: &Bound<'py, PyAny>,
    target: &str,
    output: Option<std::path::PathBuf>,
    input_shapes: Option<HashMap<String, Vec<usize>>>,
    precision: &str,
    max_size: Option<HashMap<String, usize>>,
    cuda_arch: Option<String>,
    target_cpu: &str,
) -> PyResult<Bound<'py, PyBytes>> {
    let graph = match read_model(model)? {
        Model::Graph(g) => g,
        Model::Artifact(_) => {
            return Err(KilnError::new_err("the model is already a compiled artifact"))
        }
    };
    let mut options = options_for(target_of(target)?, input_shapes, precision)?;
    if let Some(m) = max_size {
        let mut entries = m.into_iter();
        match (entries.next(), entries.next()) {
            (Some(pad), None) => options.pad = Some(pad),
            _ => return Err(KilnError::new_err("max_size pads one symbol: give {\"symbol\": n}")),
        }
    }
    if let Some(arch) = cuda_arch {
        options.ptx.arch = arch;
    }
    options.target_cpu = target_cpu.parse().map_err(|e: String| KilnError::new_err(e))?;
    if options.target != TargetKind::Cpu && target_cpu != "native" {
        return Err(KilnError::new_err(format!(
            "target_cpu=\"{target_cpu}\" is for target=\"cpu\""
        )));
    }
    let bytes = py
        .detach(|| kiln_compiler::compile(&graph, &options, false).map(|c| c.artifact.to_bytes()))
        .map_err(compile_err)?;
    if let Some(path) = output {
        // Written aside under an unpredictable name (exclusive create), then renamed.
        kiln_runtime::files::replace(&path, &[&bytes])
            .map_err(|e| KilnError::new_err(format!("{}: {e}", path.display())))?;
    }
    Ok(PyBytes::new(py, &bytes))
}

/// One stage's text: `passes`, `graph`, `fused`, `schedule`, `mlir`, `lowered`, `llvm`, `asm`,
/// `ptx` or `spirv`, as `kiln emit` prints it.
#[pyfunction]
#[pyo3(signature = (model, stage, target = "cpu", input_shapes = None, precision = "f32"))]
fn emit(
    py: Python<'_>,
    model: &Bound<'_, PyAny>,
    stage: &str,
    target: &str,
    input_shapes: Option<HashMap<String, Vec<usize>>>,
    precision: &str,
) -> PyResult<String> {
    let graph = match read_model(model)? {
        Model::Graph(g) => g,
        Model::Artifact(_) => {
            return Err(KilnError::new_err("emit takes a model, not a compiled artifact"))
        }
    };
    let options =
        Options { cache: false, ..options_for(target_of(target)?, input_shapes, precision)? };
    let stage: kiln_compiler::Stage =
        stage.parse().map_err(|e: String| compile_err(kiln_compiler::CompileError::Usage(e)))?;
    py.detach(|| kiln_compiler::driver::emit(&graph, stage, &options)).map_err(compile_err)
}

/// The devices kiln sees: one dict each (id, target, name, kind, usable, note).
#[pyfunction]
fn devices(py: Python<'_>) -> PyResult<Vec<Bound<'_, PyDict>>> {
    kiln_runtime::list_devices()
        .into_iter()
        .map(|d| {
            let o = PyDict::new(py);
            o.set_item("id", d.id)?;
            o.set_item("target", d.target.name())?;
            o.set_item("name", d.name)?;
            o.set_item("kind", d.kind)?;
            o.set_item("usable", d.usable)?;
            o.set_item("note", d.note)?;
            Ok(o)
        })
        .collect()
}

#[pymodule]
fn _kiln(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("KilnError", m.py().get_type::<KilnError>())?;
    m.add_class::<PySession>()?;
    m.add_class::<training::PyTrainSession>()?;
    m.add_function(wrap_pyfunction!(compile, m)?)?;
    m.add_function(wrap_pyfunction!(emit, m)?)?;
    m.add_function(wrap_pyfunction!(devices, m)?)?;
    Ok(())
}

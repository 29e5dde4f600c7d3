//! The `kiln` command line, run in this process on ONNX models written here: what each command
//! accepts from a user's files.

use kiln_ir::onnx::proto::tensor_shape_proto::dimension::Value as DimValue;
use kiln_ir::onnx::proto::*;
use kiln_ir::{DType, Tensor};
use prost::Message;

/// A model `y = relu(x)` whose input is declared with these dimensions (`None`: unnamed).
fn relu_model(dims: &[Option<i64>]) -> Vec<u8> {
    let dim = dims
        .iter()
        .map(|d| tensor_shape_proto::Dimension { value: d.map(DimValue::DimValue) })
        .collect();
    let ty = |dim| TypeProto {
        value: Some(type_proto::Value::TensorType(type_proto::Tensor {
            elem_type: Some(data_type::FLOAT),
            shape: Some(TensorShapeProto { dim }),
        })),
    };
    let graph = GraphProto {
        name: Some("relu".into()),
        node: vec![NodeProto {
            op_type: Some("Relu".into()),
            name: Some("r".into()),
            input: vec!["x".into()],
            output: vec!["y".into()],
            ..Default::default()
        }],
        input: vec![ValueInfoProto { name: Some("x".into()), r#type: Some(ty(dim)) }],
        output: vec![ValueInfoProto { name: Some("y".into()), r#type: Some(ty(vec![])) }],
        ..Default::default()
    };
    model_bytes(graph)
}

/// An opset-17 model of `graph`, encoded.
fn model_bytes(graph: GraphProto) -> Vec<u8> {
    model_bytes_at(graph, 17)
}

fn model_bytes_at(graph: GraphProto, opset: i64) -> Vec<u8> {
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(opset),
        }],
        graph: Some(graph),
        ..Default::default()
    }
    .encode_to_vec()
}

fn kiln<S: AsRef<str>>(args: &[S]) -> i32 {
    kiln_compiler::cli::main_with(std::iter::once("kiln").chain(args.iter().map(|s| s.as_ref())))
}

#[test]
fn bench_binds_symbolic_sizes_from_input_files_and_negative_dims_are_symbols() {
    let dir = std::env::temp_dir().join(format!("kiln-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Declared [-1, 3, -1] (as Paddle2ONNX writes "dynamic"); the file gives [2, 3, 5].
    let model = dir.join("relu.onnx");
    std::fs::write(&model, relu_model(&[Some(-1), Some(3), Some(-1)])).unwrap();
    let x = dir.join("x.npy");
    let xt = Tensor::random(DType::F32, &[2, 3, 5], 7);
    let x_values = xt.as_slice::<f32>().unwrap().to_vec();
    std::fs::write(&x, kiln_ir::npy::encode(&xt).unwrap()).unwrap();
    let (m, input) = (model.to_str().unwrap(), format!("x={}", x.display()));
    let common = ["--device", "cpu", "--threads", "1", "--warmup", "0", "--iters", "1", "--quiet"];
    let args = |extra: &[&'static str]| -> Vec<String> {
        ["bench", m].iter().chain(&common).chain(extra).map(|s| s.to_string()).collect()
    };
    let mut with_file = args(&["--input"]);
    with_file.push(input.clone());
    assert_eq!(kiln(&with_file), 0, "bench with the input from a file");
    assert_eq!(kiln(&args(&["--input-shape", "x=4,3,2"])), 0, "bench with sizes given");
    // With neither, the sizes are unknown: an error (exit 1), not a panic.
    assert_eq!(kiln(&args(&[])), 1, "bench with no sizes for a symbolic input");
    // `run` takes the same file.
    let out = dir.join("out");
    assert_eq!(
        kiln(&[
            "run",
            m,
            "--device",
            "cpu",
            "--input",
            &input,
            "--output-dir",
            out.to_str().unwrap()
        ]),
        0,
        "run"
    );
    let y = kiln_ir::npy::decode(&std::fs::read(out.join("output_0.npy")).unwrap()).unwrap();
    let want: Vec<f32> = x_values.iter().map(|v| v.max(0.0)).collect();
    assert_eq!((y.dims(), y.as_slice::<f32>().unwrap()), (&[2, 3, 5][..], &want[..]));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn compile_without_sizes_serves_any_batch_and_bench_picks_one() {
    let dir = std::env::temp_dir().join(format!("kiln-cli-batch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Declared [-1, 3]: the leading dimension is the only unknown, so it is a batch.
    let model = dir.join("relu.onnx");
    std::fs::write(&model, relu_model(&[Some(-1), Some(3)])).unwrap();
    let art = dir.join("relu.kiln");
    let (m, a) = (model.to_str().unwrap(), art.to_str().unwrap());
    assert_eq!(
        kiln(&["compile", m, "-o", a, "--no-cache", "--quiet"]),
        0,
        "compile without --input-shape"
    );
    for n in [1usize, 5, 8] {
        let xt = Tensor::random(DType::F32, &[n, 3], n as u64);
        let x = dir.join(format!("x{n}.npy"));
        std::fs::write(&x, kiln_ir::npy::encode(&xt).unwrap()).unwrap();
        let out = dir.join(format!("out{n}"));
        let input = format!("x={}", x.display());
        assert_eq!(
            kiln(&["run", a, "--input", &input, "--output-dir", out.to_str().unwrap(), "-q"]),
            0,
            "run batch {n}"
        );
        let y = kiln_ir::npy::decode(&std::fs::read(out.join("output_0.npy")).unwrap()).unwrap();
        let want: Vec<f32> = xt.as_slice::<f32>().unwrap().iter().map(|v| v.max(0.0)).collect();
        assert_eq!((y.dims(), y.as_slice::<f32>().unwrap()), (&[n, 3][..], &want[..]), "batch {n}");
    }
    let bench =
        ["bench", a, "--threads", "1", "--warmup", "0", "--iters", "1", "--quiet", "--input-shape"];
    assert_eq!(kiln(&[&bench[..], &["x=6,3"]].concat()), 0, "bench a batched artifact at batch 6");
    // A range: sizes outside it are refused at run time; a range that cannot hold is a usage error.
    assert_eq!(
        kiln(&["compile", m, "-o", a, "--no-cache", "--quiet", "--input-shape", "x=1..4,3"]),
        0,
        "compile a range"
    );
    assert_eq!(kiln(&[&bench[..], &["x=6,3"]].concat()), 1, "batch 6 outside 1..4");
    assert_eq!(
        kiln(&["compile", m, "-o", a, "--no-cache", "--quiet", "--input-shape", "x=4..2,3"]),
        1,
        "an empty range"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// One attention step over a cache that grows: `present = concat(past, x)` along the positions,
/// `y = softmax(x present^T) present`. Inputs `x: f32[1,1,4]`, `past: f32[1,"past",4]`; outputs
/// `y` and `present`.
fn cache_attention_model() -> Vec<u8> {
    let dims = |d: &[Result<i64, &str>]| {
        let dim = d
            .iter()
            .map(|v| tensor_shape_proto::Dimension {
                value: Some(match v {
                    Ok(n) => DimValue::DimValue(*n),
                    Err(p) => DimValue::DimParam(p.to_string()),
                }),
            })
            .collect();
        TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(data_type::FLOAT),
                shape: Some(TensorShapeProto { dim }),
            })),
        }
    };
    let value = |name: &str, d: &[Result<i64, &str>]| ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(dims(d)),
    };
    let int = |name: &str, i: i64| AttributeProto {
        name: Some(name.into()),
        r#type: Some(attribute_type::INT),
        i: Some(i),
        ..Default::default()
    };
    let ints = |name: &str, v: &[i64]| AttributeProto {
        name: Some(name.into()),
        r#type: Some(attribute_type::INTS),
        ints: v.to_vec(),
        ..Default::default()
    };
    let node =
        |op: &str, inputs: &[&str], output: &str, attribute: Vec<AttributeProto>| NodeProto {
            op_type: Some(op.into()),
            name: Some(output.into()),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![output.into()],
            attribute,
            ..Default::default()
        };
    let graph = GraphProto {
        name: Some("cache_attention".into()),
        node: vec![
            node("Concat", &["past", "x"], "present", vec![int("axis", 1)]),
            node("Transpose", &["present"], "keys_t", vec![ints("perm", &[0, 2, 1])]),
            node("MatMul", &["x", "keys_t"], "scores", vec![]),
            node("Softmax", &["scores"], "p", vec![int("axis", -1)]),
            node("MatMul", &["p", "present"], "y", vec![]),
        ],
        input: vec![
            value("x", &[Ok(1), Ok(1), Ok(4)]),
            value("past", &[Ok(1), Err("past"), Ok(4)]),
        ],
        output: vec![
            value("y", &[Ok(1), Ok(1), Ok(4)]),
            value("present", &[Ok(1), Err("past_1"), Ok(4)]),
        ],
        ..Default::default()
    };
    model_bytes(graph)
}

#[test]
fn compile_with_a_max_size_serves_every_length_up_to_it() {
    let dir = std::env::temp_dir().join(format!("kiln-cli-pad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("cache.onnx");
    std::fs::write(&model, cache_attention_model()).unwrap();
    let art = dir.join("cache.kiln");
    let (m, a) = (model.to_str().unwrap(), art.to_str().unwrap());
    // Without sizes `past` is not a batch (not leading): refused, and --max-size compiles it.
    assert_eq!(
        kiln(&["compile", m, "-o", a, "--no-cache", "--quiet"]),
        1,
        "compile with `past` unknown"
    );
    assert_eq!(
        kiln(&["compile", m, "-o", a, "--no-cache", "--quiet", "--max-size", "past=16"]),
        0,
        "compile up to 16"
    );
    let graph = kiln_ir::onnx::load(&model).unwrap().graph;
    for past in [0usize, 3, 16] {
        let xs = [
            Tensor::random(DType::F32, &[1, 1, 4], 1 + past as u64),
            Tensor::random(DType::F32, &[1, past, 4], 2 + past as u64),
        ];
        let mut args: Vec<String> = vec!["run".into(), a.into(), "-q".into()];
        for (name, t) in ["x", "past"].iter().zip(&xs) {
            let f = dir.join(format!("{name}{past}.npy"));
            std::fs::write(&f, kiln_ir::npy::encode(t).unwrap()).unwrap();
            args.extend(["--input".to_string(), format!("{name}={}", f.display())]);
        }
        let out = dir.join(format!("out{past}"));
        args.extend(["--output-dir".to_string(), out.to_str().unwrap().to_string()]);
        assert_eq!(kiln(&args), 0, "run past {past}");
        let want = kiln_ir::eval::run(&graph, &xs).unwrap();
        for (k, w) in want.iter().enumerate() {
            let y =
                kiln_ir::npy::decode(&std::fs::read(out.join(format!("output_{k}.npy"))).unwrap())
                    .unwrap();
            assert_eq!(y.dims(), w.dims(), "past {past}, output {k}");
            for (g, w) in y.to_f64s().iter().zip(w.to_f64s()) {
                assert!((g - w).abs() < 1e-5, "past {past}, output {k}: {g} vs {w}");
            }
        }
    }
    // A symbol the model does not have, and a malformed flag: usage errors.
    assert_eq!(
        kiln(&["compile", m, "-o", a, "--no-cache", "--quiet", "--max-size", "seq=16"]),
        1,
        "no symbol `seq`"
    );
    assert_eq!(
        kiln(&["compile", m, "-o", a, "--no-cache", "--quiet", "--max-size", "past"]),
        1,
        "no size"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn info_fails_on_a_model_that_does_not_import_and_newer_opsets_need_a_flag() {
    let dir = std::env::temp_dir().join(format!("kiln-cli-info-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, bytes: Vec<u8>| {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p.to_str().unwrap().to_string()
    };
    let ok = write("relu.onnx", relu_model(&[Some(2)]));
    assert_eq!(kiln(&["info", &ok]), 0, "info on a good model");
    // A node reading a value nothing defines: described, then a failure.
    let mut graph = ModelProto::decode(&*relu_model(&[Some(2)])).unwrap().graph.unwrap();
    graph.node[0].input = vec!["nowhere".into()];
    let broken = write("broken.onnx", model_bytes(graph.clone()));
    assert_eq!(kiln(&["info", &broken]), 1, "info on a graph with an undefined value");
    // Opset 99: refused by info and run, imported with --allow-newer-opsets.
    graph.node[0].input = vec!["x".into()];
    let newer = write("newer.onnx", model_bytes_at(graph, 99));
    assert_eq!(kiln(&["info", &newer]), 1, "info on opset 99");
    let x = dir.join("x.npy");
    std::fs::write(&x, kiln_ir::npy::encode(&Tensor::random(DType::F32, &[2], 1)).unwrap())
        .unwrap();
    let input = format!("x={}", x.display());
    assert_eq!(
        kiln(&["run", &newer, "--device", "cpu", "--input", &input, "-q"]),
        1,
        "run on opset 99"
    );
    assert_eq!(
        kiln(&["run", &newer, "--device", "cpu", "--input", &input, "-q", "--allow-newer-opsets"]),
        0,
        "run with the flag"
    );
    assert_eq!(kiln(&["info", &newer, "--allow-newer-opsets"]), 0, "info with the flag");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn models_and_inputs_larger_than_memory_are_refused_not_aborted() {
    // Expand to 100000 x 100000 x 100 floats (4 TB): compiles, and the load names the output.
    let g = kiln_ir::builder::GraphBuilder::new("expand");
    let x = g.input("x", DType::F32, [1]);
    g.output("y", x.expand(&[100000, 100000, 100]));
    let graph = g.build().unwrap();
    let art = kiln_compiler::compile(
        &graph,
        &kiln_compiler::Options { cache: false, ..Default::default() },
        false,
    )
    .unwrap()
    .artifact;
    let load = kiln_runtime::LoadOptions { max_memory: Some(1 << 30), ..Default::default() };
    let e = kiln_runtime::Executable::load(art.clone(), &load).err().expect("refused").to_string();
    assert_eq!(
        e,
        "`expand` (its constants, scratch arena and outputs; the largest is output `y` (f32[100000,100000,100])) needs 4000000000000 bytes (3.6 TiB), more than the memory budget of 1073741824 bytes (1.0 GiB): the memory available, or --max-memory / LoadOptions::max_memory"
    );
    // With the default budget (the memory available), the same error rather than an abort.
    assert!(kiln_runtime::Executable::load(art, &Default::default()).is_err());
    // An artifact of several programs (a symbolic batch: 8, 4, 2 and 1) needs them all.
    let g = kiln_ir::builder::GraphBuilder::new("mlp");
    let x = g.input("x", DType::F32, vec![kiln_ir::Dim::sym("N"), 64.into()]);
    g.output("y", x.matmul(g.constant("w", Tensor::random(DType::F32, &[64, 512], 1))).relu());
    let batched = kiln_compiler::compile(
        &g.build().unwrap(),
        &kiln_compiler::Options { cache: false, ..Default::default() },
        false,
    )
    .unwrap()
    .artifact;
    let programs = &batched.manifest.batch.as_ref().unwrap().programs;
    // (At the threads a default load runs on: each program's kernels keep scratch per thread.)
    let threads = kiln_runtime::LoadOptions::default().cpu_threads();
    let whole = kiln_runtime::Executable::memory_needed(&batched.manifest, threads).unwrap();
    let largest = programs
        .iter()
        .map(|p| kiln_runtime::Executable::memory_needed(&p.manifest, threads).unwrap())
        .max()
        .unwrap();
    assert!(whole > largest, "{whole} > {largest}");
    for (max, fits) in [(whole, true), (whole - 1, false)] {
        let r = kiln_runtime::Executable::load(
            batched.clone(),
            &kiln_runtime::LoadOptions { max_memory: Some(max), ..Default::default() },
        );
        assert_eq!(r.is_ok(), fits, "a budget of {max} bytes for {whole}");
    }
    // From the command line: an input declared 1000000 x 1000000 and the Expand, each refused
    // (exit 1) by bench and run, with the default budget and with --max-memory.
    let dir = std::env::temp_dir().join(format!("kiln-cli-memory-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let huge = dir.join("huge.onnx");
    std::fs::write(&huge, relu_model(&[Some(1_000_000), Some(1_000_000)])).unwrap();
    let h = huge.to_str().unwrap();
    let bench = [
        "bench",
        h,
        "--device",
        "cpu",
        "--threads",
        "1",
        "--warmup",
        "0",
        "--iters",
        "1",
        "--quiet",
    ];
    assert_eq!(kiln(&bench), 1, "bench on a 4 TB input");
    assert_eq!(
        kiln(&[&bench[..], &["--max-memory", "1G"]].concat()),
        1,
        "bench on a 4 TB input, 1 GiB budget"
    );
    assert_eq!(
        kiln(&[&bench[..], &["--max-memory", "lots"]].concat()),
        2,
        "a budget that is not a size"
    );
    // What bench says for it, at a budget of 1 GiB.
    let e = kiln_compiler::tune::random_input(
        "x",
        DType::F32,
        &[1_000_000, 1_000_000],
        1,
        &mut (1 << 30),
    )
    .err()
    .unwrap()
    .to_string();
    assert_eq!(
        e,
        "random input `x` (f32[1000000,1000000]) needs 4000000000000 bytes (3.6 TiB), more than the memory budget of 1073741824 bytes (1.0 GiB): the memory available, or --max-memory / LoadOptions::max_memory"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_model_larger_than_the_opencl_device_is_refused_at_load() {
    if !kiln_runtime::list_devices()
        .iter()
        .any(|d| d.target == kiln_runtime::Target::Opencl && d.usable)
    {
        eprintln!("SKIPPED: no OpenCL device (run `eval \"$(scripts/setup-opencl.sh)\"`); the device-memory check was not exercised");
        return;
    }
    // A relu over 8 * 10^9 floats: 32 GB in and 32 GB out, more than the device's memory.
    let g = kiln_ir::builder::GraphBuilder::new("wide");
    let x = g.input("x", DType::F32, [80000, 100000]);
    g.output("y", x.relu());
    let options = kiln_compiler::Options {
        cache: false,
        target: kiln_compiler::TargetKind::Opencl,
        ..Default::default()
    };
    let art = kiln_compiler::compile(&g.build().unwrap(), &options, false).unwrap().artifact;
    // No host budget: the device's own memory refuses it.
    let load = kiln_runtime::LoadOptions { max_memory: Some(u64::MAX), ..Default::default() };
    let e = kiln_runtime::Executable::load(art, &load).err().expect("refused").to_string();
    assert!(
        e.starts_with("`wide` on ")
            && e.contains("(its buffers in device memory) needs 64000000000 bytes (59.6 GiB)"),
        "{e}"
    );
}

/// `--dump-dir` writes each stage the CPU has into the file the stage table names, and nothing
/// for the stages of other targets.
#[test]
fn dump_dir_writes_each_stage_to_its_file() {
    let dir = std::env::temp_dir().join(format!("kiln-cli-dump-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("relu.onnx");
    std::fs::write(&model, relu_model(&[Some(2), Some(3)])).unwrap();
    let (art, dumps) = (dir.join("relu.kiln"), dir.join("ir"));
    let args = [
        model.to_str().unwrap(),
        "-o",
        art.to_str().unwrap(),
        "--dump-dir",
        dumps.to_str().unwrap(),
    ];
    assert_eq!(kiln(&[&["compile"][..], &args, &["--no-cache", "--quiet"]].concat()), 0);
    for stage in kiln_compiler::Stage::ALL {
        let Some(file) = stage.file_name() else { continue };
        let cpu =
            kiln_compiler::backend::stages_of(kiln_compiler::TargetKind::Cpu).contains(&stage);
        assert_eq!(dumps.join(file).exists(), cpu, "{stage}: {file}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `kiln run --output-dir` writes a result numpy has no type for (here f8e4m3fn, from a Cast)
/// widened to one that holds its values exactly.
#[test]
fn run_writes_results_numpy_lacks_widened() {
    let f32_type = |elem: i32| TypeProto {
        value: Some(type_proto::Value::TensorType(type_proto::Tensor {
            elem_type: Some(elem),
            shape: Some(TensorShapeProto {
                dim: vec![tensor_shape_proto::Dimension { value: Some(DimValue::DimValue(4)) }],
            }),
        })),
    };
    let graph = GraphProto {
        name: Some("to_f8".into()),
        node: vec![NodeProto {
            op_type: Some("Cast".into()),
            name: Some("c".into()),
            input: vec!["x".into()],
            output: vec!["y".into()],
            attribute: vec![AttributeProto {
                name: Some("to".into()),
                r#type: Some(attribute_type::INT),
                i: Some(17),
                ..Default::default()
            }],
            ..Default::default()
        }],
        input: vec![ValueInfoProto {
            name: Some("x".into()),
            r#type: Some(f32_type(data_type::FLOAT)),
        }],
        output: vec![ValueInfoProto { name: Some("y".into()), r#type: Some(f32_type(17)) }],
        ..Default::default()
    };
    let dir = std::env::temp_dir().join(format!("kiln-cli-f8-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("m.onnx");
    std::fs::write(&model, model_bytes_at(graph, 21)).unwrap();
    let x = dir.join("x.npy");
    kiln_ir::npy::write(&x, &Tensor::from_vec(&[4], vec![1.0f32, 0.3, -500.0, 3.1]).unwrap())
        .unwrap();
    let out = dir.join("out");
    let code = kiln(&[
        "run",
        model.to_str().unwrap(),
        "--input",
        &format!("x={}", x.display()),
        "--output-dir",
        out.to_str().unwrap(),
        "-q",
    ]);
    assert_eq!(code, 0);
    let y = kiln_ir::npy::read(&out.join("output_0.npy")).unwrap();
    assert_eq!(y.dtype(), DType::F32);
    assert_eq!(y.to_f64s(), vec![1.0, 0.3125, -448.0, 3.0]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// An f32 tensor type of these fixed sizes.
fn f32_type(dims: &[i64]) -> TypeProto {
    TypeProto {
        value: Some(type_proto::Value::TensorType(type_proto::Tensor {
            elem_type: Some(data_type::FLOAT),
            shape: Some(TensorShapeProto {
                dim: dims
                    .iter()
                    .map(|&d| tensor_shape_proto::Dimension { value: Some(DimValue::DimValue(d)) })
                    .collect(),
            }),
        })),
    }
}

/// `t` as an initializer named `name`.
fn initializer(t: Tensor, name: &str) -> TensorProto {
    TensorProto::decode(kiln_ir::onnx::encode_tensor(&t, name).as_slice()).unwrap()
}

/// A model `y = relu(conv3x3(x, w) + b)` on x: f32[1, 8, 12, 12], weights initializers.
fn conv_model() -> Vec<u8> {
    let graph = GraphProto {
        name: Some("conv".into()),
        node: vec![
            NodeProto {
                op_type: Some("Conv".into()),
                name: Some("c".into()),
                input: vec!["x".into(), "w".into(), "b".into()],
                output: vec!["c".into()],
                attribute: vec![AttributeProto {
                    name: Some("pads".into()),
                    r#type: Some(attribute_type::INTS),
                    ints: vec![1, 1, 1, 1],
                    ..Default::default()
                }],
                ..Default::default()
            },
            NodeProto {
                op_type: Some("Relu".into()),
                name: Some("r".into()),
                input: vec!["c".into()],
                output: vec!["y".into()],
                ..Default::default()
            },
        ],
        initializer: vec![
            initializer(Tensor::random(DType::F32, &[16, 8, 3, 3], 1), "w"),
            initializer(Tensor::random(DType::F32, &[16], 2), "b"),
        ],
        input: vec![ValueInfoProto {
            name: Some("x".into()),
            r#type: Some(f32_type(&[1, 8, 12, 12])),
        }],
        output: vec![ValueInfoProto {
            name: Some("y".into()),
            r#type: Some(f32_type(&[1, 16, 12, 12])),
        }],
        ..Default::default()
    };
    model_bytes(graph)
}

#[test]
fn precision_flags_compile_run_bench_and_report_the_deviation() {
    let dir = std::env::temp_dir().join(format!("kiln-cli-precision-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("conv.onnx");
    std::fs::write(&model, conv_model()).unwrap();
    let m = model.to_str().unwrap();
    let x = dir.join("x.npy");
    kiln_ir::npy::write(&x, &Tensor::random(DType::F32, &[1, 8, 12, 12], 3)).unwrap();
    let input = format!("x={}", x.display());
    // Usage errors, whatever the machine: a deviation from f32 needs another precision, an
    // unknown precision is refused by clap, f16 has no CPU kernels.
    assert_ne!(kiln(&["run", m, "--input", &input, "--deviation", "-q"]), 0);
    assert_ne!(kiln(&["bench", m, "--iters", "1", "--deviation", "-q"]), 0);
    assert_ne!(kiln(&["run", m, "--input", &input, "--precision", "fp8", "-q"]), 0);
    assert_ne!(kiln(&["run", m, "--input", &input, "--precision", "f16", "-q"]), 0);
    let art = dir.join("conv.kiln");
    let code = kiln(&["compile", m, "-o", art.to_str().unwrap(), "--precision", "bf16", "-q"]);
    if code != 0 {
        eprintln!("SKIPPED the bf16 half of precision_flags_compile_run_bench_and_report_the_deviation: this machine cannot compile --precision bf16");
        return;
    }
    // An artifact keeps the precision it was compiled with.
    assert_ne!(
        kiln(&["run", art.to_str().unwrap(), "--input", &input, "--precision", "bf16", "-q"]),
        0
    );
    assert_eq!(kiln(&["run", art.to_str().unwrap(), "--input", &input, "-q"]), 0);
    assert_eq!(kiln(&["run", m, "--input", &input, "--precision", "bf16", "--deviation", "-q"]), 0);
    let bench = ["bench", m, "--iters", "2", "--precision", "bf16", "--deviation", "--json", "-q"];
    assert_eq!(kiln(&[&bench[..], &["--deviation-samples", "3"]].concat()), 0);
    // The old spelling, `--deviation N`, still works.
    assert_eq!(kiln(&[&bench[..], &["3"]].concat()), 0);
}

#[test]
fn deviations_measure_the_largest_difference_and_top_1_per_row() {
    let f32 = Tensor::from_vec(&[2, 3], vec![1.0f32, 2.0, 3.0, 0.5, 0.4, -4.0]).unwrap();
    let got = Tensor::from_vec(&[2, 3], vec![1.0f32, 2.0, 3.5, 0.3, 0.45, -4.0]).unwrap();
    let d = kiln_compiler::cli::Deviation::of(&got, &f32);
    assert_eq!(d.max_abs, 0.5);
    assert_eq!(d.relative, 0.5 / 4.0);
    assert!((d.mean_abs - 0.75 / 6.0).abs() < 1e-7, "{}", d.mean_abs);
    // Row 0's top-1 stays (index 2); row 1's moves from 0.5 to 0.45.
    assert_eq!((d.rows, d.same_top1), (2, 1));
    assert!(
        d.to_string().contains("top-1 (largest along the last axis) the same in 1 of 2 row(s)"),
        "{d}"
    );
    // NaN where f32 has a number is the largest difference, whatever comes after it; NaN on
    // both sides is none.
    let f32 = Tensor::from_vec(&[4], vec![1.0f32, f32::NAN, 2.0, f32::INFINITY]).unwrap();
    let got = Tensor::from_vec(&[4], vec![f32::NAN, f32::NAN, 9.0, f32::INFINITY]).unwrap();
    assert!(kiln_compiler::cli::Deviation::of(&got, &f32).max_abs.is_nan());
    let got = Tensor::from_vec(&[4], vec![1.0f32, f32::NAN, 2.5, f32::INFINITY]).unwrap();
    assert_eq!(kiln_compiler::cli::Deviation::of(&got, &f32).max_abs, 0.5);
}

#[test]
fn cache_prune_and_clear_are_one_or_the_other() {
    assert_eq!(kiln(&["cache", "--prune", "--clear"]), 2);
}

/// An input file is checked against `--max-memory`, not only the memory available: a 4 MB `.npy`
/// that a model summing it would fit in 6 MB is refused under a 6 MB budget before it is read
/// (reading it takes twice its size), and read without one.
#[test]
fn input_files_are_checked_against_max_memory() {
    let dir = std::env::temp_dir().join(format!("kiln-cli-input-budget-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let graph = GraphProto {
        name: Some("sum".into()),
        node: vec![NodeProto {
            op_type: Some("ReduceSum".into()),
            name: Some("s".into()),
            input: vec!["x".into()],
            output: vec!["y".into()],
            attribute: vec![AttributeProto {
                name: Some("keepdims".into()),
                r#type: Some(attribute_type::INT),
                i: Some(0),
                ..Default::default()
            }],
            ..Default::default()
        }],
        input: vec![ValueInfoProto {
            name: Some("x".into()),
            r#type: Some(f32_type(&[1024, 1024])),
        }],
        output: vec![ValueInfoProto { name: Some("y".into()), r#type: Some(f32_type(&[])) }],
        ..Default::default()
    };
    let model = dir.join("sum.onnx");
    std::fs::write(&model, model_bytes(graph)).unwrap();
    let x = dir.join("x.npy");
    kiln_ir::npy::write(&x, &Tensor::random(DType::F32, &[1024, 1024], 3)).unwrap();
    let input = format!("x={}", x.display());
    let m = model.to_str().unwrap();
    let run = ["run", m, "--device", "cpu", "--threads", "1", "--input", &input, "--quiet"];
    assert_eq!(kiln(&[&run[..], &["--max-memory", "6M"]].concat()), 1, "a 4 MB input, 6 MB budget");
    assert_eq!(kiln(&[&run[..], &["--max-memory", "16M"]].concat()), 0, "within 16 MB");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The CLI behaves as the tools people know: `kiln info` describes an artifact (it called one a
/// corrupt ONNX file), a repeated `--input`, a PTX ISA LLVM does not write and an output folder
/// that does not exist are errors (exit 1; the first two were accepted), times keep three digits
/// (a small model's time printed as `0.00 ms`), and an all-NaN output says so (`min inf, max
/// -inf`).
#[test]
fn the_cli_behaves() {
    let dir = std::env::temp_dir().join(format!("kiln-cli-behaves-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("relu.onnx");
    std::fs::write(&model, relu_model(&[Some(2), Some(3)])).unwrap();
    let m = model.to_str().unwrap();
    let art = dir.join("relu.kiln");
    assert_eq!(kiln(&["compile", m, "-o", art.to_str().unwrap(), "-q", "--no-cache"]), 0);
    assert_eq!(kiln(&["info", art.to_str().unwrap()]), 0, "kiln info on an artifact");
    let a = kiln_runtime::artifact::Artifact::read(&art).unwrap();
    let lines = kiln_compiler::cli::artifact_lines(&a.manifest, 1000);
    assert!(lines[0].starts_with("artifact of `relu`, compiled by kiln"), "{lines:?}");
    assert!(lines.iter().any(|l| l.starts_with("target: cpu (")), "{lines:?}");
    assert!(lines.contains(&"  x: f32[2,3]".to_string()), "{lines:?}");
    assert!(lines.iter().any(|l| l.starts_with("one program: 1 kernel, 1 launch")), "{lines:?}");
    let x = dir.join("x.npy");
    kiln_ir::npy::write(&x, &Tensor::random(DType::F32, &[2, 3], 1)).unwrap();
    let input = format!("x={}", x.display());
    assert_eq!(kiln(&["run", m, "--device", "cpu", "--input", &input, "--input", &input]), 1);
    assert_eq!(kiln(&["compile", m, "--target", "cuda", "--ptx-isa", "9.9", "-o", "y.kiln"]), 1);
    let nowhere = dir.join("no/such/folder/relu.kiln");
    assert_eq!(kiln(&["compile", m, "-o", nowhere.to_str().unwrap(), "-q", "--no-cache"]), 1);
    assert!(!dir.join("no").exists());
    use std::time::Duration;
    assert_eq!(kiln_compiler::cli::ms(Duration::from_micros(4)), "4.0 us");
    assert_eq!(kiln_compiler::cli::ms(Duration::from_micros(250)), "0.250 ms");
    assert_eq!(kiln_compiler::cli::ms(Duration::from_millis(1234)), "1234 ms");
    assert_eq!(kiln_compiler::cli::range_text(&[f64::NAN, f64::NAN]), "all 2 NaN");
    assert_eq!(
        kiln_compiler::cli::range_text(&[1.0, f64::NAN, -2.0]),
        "min -2.000000, max 1.000000, 1 NaN"
    );
    assert_eq!(kiln_compiler::cli::range_text(&[]), "empty");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A model `y = softmax(relu(x w + b))` on x: f32[2, 8], two kernels (the matrix product with its
/// bias and activation, the softmax), weights large enough to be buffers.
fn mlp_model() -> Vec<u8> {
    let node = |op: &str, inputs: &[&str], output: &str| NodeProto {
        op_type: Some(op.into()),
        name: Some(output.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        ..Default::default()
    };
    let graph = GraphProto {
        name: Some("mlp".into()),
        node: vec![
            node("MatMul", &["x", "w"], "fc"),
            node("Add", &["fc", "b"], "biased"),
            node("Relu", &["biased"], "act"),
            node("Softmax", &["act"], "y"),
        ],
        initializer: vec![
            initializer(Tensor::random(DType::F32, &[8, 32], 1), "w"),
            initializer(Tensor::random(DType::F32, &[32], 2), "b"),
        ],
        input: vec![ValueInfoProto { name: Some("x".into()), r#type: Some(f32_type(&[2, 8])) }],
        output: vec![ValueInfoProto { name: Some("y".into()), r#type: Some(f32_type(&[2, 32])) }],
        ..Default::default()
    };
    model_bytes(graph)
}

/// A trace's events of phase `X` (complete slices).
fn slices(trace: &serde_json::Value) -> Vec<&serde_json::Value> {
    trace["traceEvents"]
        .as_array()
        .expect("traceEvents is a list")
        .iter()
        .filter(|e| e["ph"] == "X")
        .collect()
}

/// `kiln run --trace` and `kiln bench --trace` write a Chrome/Perfetto trace: metadata naming
/// the process and thread, the import, the compile and its phases, the load, each run, and one
/// slice per kernel launch named after the kernel, nested in its run; a trace whose folder does
/// not exist is refused before anything runs.
#[test]
fn run_and_bench_write_a_trace_of_every_launch() {
    let dir = std::env::temp_dir().join(format!("kiln-cli-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("mlp.onnx");
    std::fs::write(&model, mlp_model()).unwrap();
    let m = model.to_str().unwrap();
    let x = dir.join("x.npy");
    kiln_ir::npy::write(&x, &Tensor::random(DType::F32, &[2, 8], 3)).unwrap();
    let input = format!("x={}", x.display());
    // The kernels a run launches, in order, as the compiler labels them.
    let graph = kiln_ir::onnx::load(&model).unwrap().graph;
    let art = kiln_compiler::compile(
        &graph,
        &kiln_compiler::Options { cache: false, ..Default::default() },
        false,
    )
    .unwrap()
    .artifact;
    let labels: Vec<String> = art
        .manifest
        .launches
        .iter()
        .map(|l| art.manifest.kernels[l.kernel].label.clone())
        .collect();
    assert_eq!(labels.len(), 2, "{labels:?}");
    let read = |p: &std::path::Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(p).unwrap()).expect("the trace is JSON")
    };

    let trace = dir.join("run.json");
    let run_args =
        ["run", m, "--device", "cpu", "--threads", "1", "--input", &input, "-q", "--trace"];
    assert_eq!(kiln(&[&run_args[..], &[trace.to_str().unwrap()]].concat()), 0);
    let t = read(&trace);
    let events = t["traceEvents"].as_array().unwrap();
    let named = |what: &str| {
        events.iter().any(|e| e["ph"] == "M" && e["name"] == what && e["args"]["name"].is_string())
    };
    assert!(named("process_name") && named("thread_name"), "{t:#}");
    let xs = slices(&t);
    for e in &xs {
        let (ts, dur) = (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap());
        assert!(ts >= 0.0 && dur >= 0.0, "{e}");
        assert!(e["pid"].is_u64() && e["tid"].is_u64() && e["name"].is_string(), "{e}");
    }
    let of = |cat: &str| xs.iter().filter(|e| e["cat"] == cat).copied().collect::<Vec<_>>();
    let kernels: Vec<&str> = of("kernel").iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(kernels, labels, "one slice per launch, named after its kernel");
    assert_eq!(of("import").len(), 1, "{t:#}");
    assert_eq!(of("load").len(), 1, "{t:#}");
    // The compile (or its cache hit) and the phases the compiler timed, inside it.
    let compile = of("compile");
    assert!(compile.iter().any(|e| e["name"].as_str().unwrap().starts_with("compile")), "{t:#}");
    assert!(compile.len() >= 2, "the compile's phases: {t:#}");
    let [run] = of("run")[..] else { panic!("one run: {t:#}") };
    let span = |e: &serde_json::Value| {
        let ts = e["ts"].as_f64().unwrap();
        (ts, ts + e["dur"].as_f64().unwrap())
    };
    let (start, end) = span(run);
    for k in of("kernel") {
        let (a, b) = span(k);
        assert!(a >= start && b <= end + 1.0, "launch {k} inside the run {run}");
    }

    // bench: every run a slice; the profiled runs (as --profile's) each launch.
    let trace = dir.join("bench.json");
    let bench = ["bench", m, "--device", "cpu", "--threads", "1", "--warmup", "1", "--iters", "2"];
    let traced = [&bench[..], &["--input", &input, "-q", "--trace", trace.to_str().unwrap()]];
    assert_eq!(kiln(&traced.concat()), 0);
    let t = read(&trace);
    let xs = slices(&t);
    let names = |cat: &str| {
        xs.iter()
            .filter(|e| e["cat"] == cat)
            .map(|e| e["name"].as_str().unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names("run"),
        ["warmup 1", "run 1", "run 2", "profiled run 1", "profiled run 2"],
        "{t:#}"
    );
    assert_eq!(names("kernel"), [&labels[..], &labels[..]].concat(), "{t:#}");

    // A folder that does not exist: refused (exit 1) before the run, nothing written.
    let nowhere = dir.join("no/such/trace.json");
    assert_eq!(kiln(&[&run_args[..], &[nowhere.to_str().unwrap()]].concat()), 1);
    assert!(!dir.join("no").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The trace is a pure function of what was recorded: a CPU run's launches on the command's
/// thread, a CUDA run's on its streams with its copies, and an out-of-order queue's overlapping
/// launches on a lane beside the queue's.
#[test]
fn trace_json_is_pinned() {
    use kiln_compiler::cli::trace::{json, Span, Timeline, TracedRun};
    use kiln_runtime::{CopySpan, Profile, Track};
    use std::time::Duration;
    let us = Duration::from_micros;
    let span = |name: &str, category, start, time| Span {
        name: name.into(),
        category,
        start: us(start),
        time: us(time),
    };
    let profile = |launches: &[(&str, u64, u64, Track)], copies: Vec<CopySpan>| {
        let mut p = Profile::default();
        for &(label, start, time, track) in launches {
            p.launches.push((label.into(), us(time)));
            p.starts.push(us(start));
            p.tracks.push(track);
            p.work.push(kiln_runtime::device::Work { bytes: 4096, flops: 0 });
        }
        p.copies = copies;
        p
    };
    let cpu = Timeline {
        command: "kiln run mlp.onnx".into(),
        device: "cpu (2 threads)".into(),
        host: vec![
            span("import mlp.onnx", "import", 0, 100),
            span("compile", "compile", 100, 1000),
            span("passes", "compile", 100, 200),
            span("codegen", "compile", 300, 800),
            span("load", "load", 1100, 50),
            span("run", "run", 1200, 40),
        ],
        runs: vec![TracedRun {
            name: "run".into(),
            origin: us(1201),
            profile: profile(
                &[
                    ("fc: MatMul + Add + Relu", 2, 20, Track::Host),
                    ("y: Softmax", 25, 10, Track::Host),
                ],
                vec![],
            ),
        }],
    };
    insta::assert_snapshot!("trace_cpu", format!("{:#}", json(&cpu)));
    let copy = |to_device, start, time| CopySpan {
        to_device,
        bytes: 64,
        start: us(start),
        time: us(time),
    };
    let cuda = Timeline {
        command: "kiln bench mlp.onnx".into(),
        device: "cuda:0 NVIDIA H100".into(),
        host: vec![span("profiled run 1", "run", 10, 100)],
        runs: vec![TracedRun {
            name: "profiled run 1".into(),
            origin: us(10),
            profile: profile(
                &[
                    ("a: Conv", 5, 30, Track::CudaStream(0)),
                    ("b: Conv", 6, 20, Track::CudaStream(1)),
                    ("c: Add", 40, 5, Track::CudaStream(0)),
                ],
                vec![copy(true, 0, 4), copy(false, 50, 3)],
            ),
        }],
    };
    insta::assert_snapshot!("trace_cuda", format!("{:#}", json(&cuda)));
    // An out-of-order queue: the second launch starts before the first ends.
    let opencl = Timeline {
        command: "kiln run m.onnx".into(),
        device: "opencl:0".into(),
        host: vec![],
        runs: vec![TracedRun {
            name: "run".into(),
            origin: us(0),
            profile: profile(
                &[("a: Relu", 0, 10, Track::OpenclQueue), ("b: Neg", 5, 10, Track::OpenclQueue)],
                vec![],
            ),
        }],
    };
    let t = json(&opencl);
    let tid_of = |name: &str| {
        slices(&t).iter().find(|e| e["name"] == name).map(|e| e["tid"].as_u64().unwrap()).unwrap()
    };
    assert_ne!(tid_of("a: Relu"), tid_of("b: Neg"), "overlapping slices on lanes: {t:#}");
}

/// `kiln emit --stage fused --format dot` draws the kernels (boxes: name, root node and ops) and
/// the buffers between them (ellipses: name and type; inputs, outputs, constants and views each
/// their own way) for Graphviz; `--format dot` with another stage is a usage error naming the
/// flag and the stage that takes it.
#[test]
fn fused_stage_draws_as_a_graphviz_digraph() {
    use kiln_ir::builder::{ConvOptions, GraphBuilder};
    let g = GraphBuilder::new("drawn");
    let x = g.input("x", DType::F32, [1, 8, 6, 6]);
    let r = x.relu().named("r");
    let halves = r.split(1, &[3, 5]);
    let w = g.constant("w", Tensor::random(DType::F32, &[4, 3, 3, 3], 2));
    let c = halves[0].conv(w, None, ConvOptions::default().pad(1)).named("conv");
    g.output("upper", halves[1]);
    g.output("probs", c.reshape(&[4, 36]).named("flat").softmax(-1).named("softmax"));
    let graph = g.build().unwrap();
    let options = kiln_compiler::Options { cache: false, ..Default::default() };
    let drawn = kiln_compiler::driver::fused_dot(&graph, &options).unwrap();
    insta::assert_snapshot!("fused_dot", drawn);
    // Graphviz reads it, where it is installed.
    match std::process::Command::new("dot")
        .arg("-Tsvg")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
    {
        Ok(mut child) => {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(drawn.as_bytes()).unwrap();
            assert!(child.wait().unwrap().success(), "dot -Tsvg refused:\n{drawn}");
        }
        Err(_) => {
            eprintln!("SKIPPED: Graphviz's `dot` is not installed; the digraph was not drawn")
        }
    }

    let dir = std::env::temp_dir().join(format!("kiln-cli-dot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("mlp.onnx");
    std::fs::write(&model, mlp_model()).unwrap();
    let m = model.to_str().unwrap();
    assert_eq!(kiln(&["emit", m, "--stage", "fused", "--format", "dot"]), 0);
    assert_eq!(kiln(&["emit", m, "--stage", "fused", "--format", "text"]), 0);
    assert_eq!(kiln(&["emit", m, "--stage", "mlir", "--format", "dot"]), 1);
    assert_eq!(kiln(&["emit", m, "--stage", "fused", "--format", "svg"]), 2);
    use kiln_compiler::{cli::Format, Stage};
    let e = Format::Dot.check(Stage::Mlir).unwrap_err().to_string();
    assert!(e.contains("--format dot") && e.contains("--stage fused") && e.contains("mlir"), "{e}");
    assert!(Format::Dot.check(Stage::Fused).is_ok() && Format::Text.check(Stage::Asm).is_ok());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `kiln emit` takes `--max-size` as `kiln compile` does, and says which program it shows for a
/// model of several (a symbolic batch: its largest) or of a padded symbol, instead of showing a
/// batch-8 program as if it were the model.
#[test]
fn emit_takes_max_size_and_says_which_program_it_shows() {
    let dir = std::env::temp_dir().join(format!("kiln-cli-emit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cache = dir.join("cache.onnx");
    std::fs::write(&cache, cache_attention_model()).unwrap();
    let c = cache.to_str().unwrap();
    assert_eq!(kiln(&["emit", c, "--stage", "fused"]), 1, "`past` unknown and not a batch");
    for stage in ["passes", "graph", "fused", "mlir"] {
        assert_eq!(kiln(&["emit", c, "--stage", stage, "--max-size", "past=16"]), 0, "{stage}");
    }
    assert_eq!(kiln(&["emit", c, "--stage", "fused", "--max-size", "past"]), 1, "no size");
    let options = |pad: Option<(&str, usize)>| kiln_compiler::Options {
        cache: false,
        pad: pad.map(|(s, n)| (s.to_string(), n)),
        ..Default::default()
    };
    let graph = kiln_ir::onnx::load(&cache).unwrap().graph;
    let (_, note) = kiln_compiler::driver::emitted_program(&graph, &options(Some(("past", 16))));
    assert!(note.as_deref().is_some_and(|n| n.contains("`past` up to 16")), "{note:?}");
    let fused = kiln_compiler::driver::emit(
        &graph,
        kiln_compiler::Stage::Fused,
        &options(Some(("past", 16))),
    )
    .unwrap();
    assert!(fused.contains("f32[1,16,4]"), "the program at the capacity: {fused}");
    // A symbolic batch: every stage shows its largest program, and says so.
    let batch = dir.join("relu.onnx");
    std::fs::write(&batch, relu_model(&[Some(-1), Some(3)])).unwrap();
    let b = batch.to_str().unwrap();
    for stage in ["passes", "graph", "fused", "mlir", "asm"] {
        assert_eq!(kiln(&["emit", b, "--stage", stage]), 0, "{stage}");
    }
    let graph = kiln_ir::onnx::load(&batch).unwrap().graph;
    let (shown, note) = kiln_compiler::driver::emitted_program(&graph, &options(None));
    let note = note.expect("a symbolic batch says which program");
    assert!(note.contains("showing the program for") && note.contains("=8"), "{note}");
    assert_eq!(shown.input_shapes.values().next(), Some(&vec![8, 3]));
    // Sizes given: one program, nothing to say.
    let sized = kiln_compiler::Options {
        input_shapes: [("x".to_string(), vec![2, 3])].into(),
        ..options(None)
    };
    assert_eq!(kiln_compiler::driver::emitted_program(&graph, &sized).1, None);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Flags mean one thing across subcommands: `--deviation` is a switch in `run` and `bench`
/// (bench's number of samples is `--deviation-samples`; the old `--deviation N` still works);
/// `kiln check` runs `--jobs` tests at a time (`--threads` there is its old, hidden spelling).
#[test]
fn flags_mean_the_same_in_every_subcommand() {
    let dir = std::env::temp_dir().join(format!("kiln-cli-flags-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("relu.onnx");
    std::fs::write(&model, relu_model(&[Some(2), Some(3)])).unwrap();
    let m = model.to_str().unwrap();
    let bench = ["bench", m, "--device", "cpu", "--iters", "1", "--warmup", "0", "-q"];
    let with = |extra: &[&str]| -> Vec<String> {
        bench.iter().chain(extra).map(|s| s.to_string()).collect()
    };
    // Without a reduced precision, --deviation is a usage error in both spellings.
    assert_eq!(kiln(&with(&["--deviation"])), 1);
    assert_eq!(kiln(&with(&["--deviation", "3"])), 1);
    // --deviation-samples needs --deviation; a stray argument is refused.
    assert_eq!(kiln(&with(&["--deviation-samples", "3"])), 2);
    assert_eq!(kiln(&with(&["extra"])), 1);
    assert_eq!(kiln(&with(&[])), 0);

    // A backend-style test folder: the relu model and one data set.
    let case = dir.join("suite/test_relu");
    let data = case.join("test_data_set_0");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(case.join("model.onnx"), relu_model(&[Some(2), Some(3)])).unwrap();
    let xt = Tensor::from_vec(&[2, 3], vec![1.0f32, -2.0, 3.0, -4.0, 5.0, -6.0]).unwrap();
    let yt = Tensor::from_vec(&[2, 3], vec![1.0f32, 0.0, 3.0, 0.0, 5.0, 0.0]).unwrap();
    std::fs::write(data.join("input_0.pb"), kiln_ir::onnx::encode_tensor(&xt, "x")).unwrap();
    std::fs::write(data.join("output_0.pb"), kiln_ir::onnx::encode_tensor(&yt, "y")).unwrap();
    let c = case.to_str().unwrap();
    assert_eq!(kiln(&["check", c, "--jobs", "1", "-q"]), 0, "--jobs");
    assert_eq!(kiln(&["check", c, "-j", "1", "-q"]), 0, "-j");
    assert_eq!(kiln(&["check", c, "--threads", "1", "-q"]), 0, "the old spelling still works");
    assert_eq!(kiln(&["check", c, "--threads", "1", "--jobs", "1", "-q"]), 2, "not both");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every subcommand's every flag and argument has help text (`kiln <cmd> --help` shows none
/// without a description), and so does every value a flag lists.
#[test]
fn every_flag_has_help() {
    fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            if arg.get_help().is_none() && arg.get_long_help().is_none() {
                missing.push(format!("{path} {id}"));
            }
            for v in arg.get_possible_values() {
                if !v.is_hide_set() && v.get_help().is_none() {
                    missing.push(format!("{path} {id}={}", v.get_name()));
                }
            }
        }
        for sub in cmd.get_subcommands() {
            walk(sub, &format!("{path} {}", sub.get_name()), missing);
        }
    }
    let mut cmd = kiln_compiler::cli::command();
    // The help and version flags clap adds exist once built.
    cmd.build();
    let mut missing = Vec::new();
    walk(&cmd, "kiln", &mut missing);
    assert!(missing.is_empty(), "flags without help: {missing:#?}");
}

//! The `kiln` command line, run in this process on ONNX models written here: what each command
//! accepts from a user's files.

use kiln_ir::onnx::proto::tensor_shape_proto::dimension::Value as DimValue;
use kiln_ir::onnx::proto::*;
use kiln_ir::{DType, Tensor};
use prost::Message;

/// A model `y = relu(x)` whose input is declared with these dimensions (`None`: unnamed).
fn relu_model(dims: &[Option<i64>]) -> Vec<u8> {
    let dim = dims.iter().map(|d| tensor_shape_proto::Dimension { value: d.map(DimValue::DimValue) }).collect();
    let ty = |dim| TypeProto {
        value: Some(type_proto::Value::TensorType(type_proto::Tensor { elem_type: Some(data_type::FLOAT), shape: Some(TensorShapeProto { dim }) })),
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
        input: vec![ValueInfoProto { name: Some("x".into()), r#type: Some(ty(dim)), ..Default::default() }],
        output: vec![ValueInfoProto { name: Some("y".into()), r#type: Some(ty(vec![])), ..Default::default() }],
        ..Default::default()
    };
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(17) }],
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
    let args = |extra: &[&'static str]| -> Vec<String> { ["bench", m].iter().chain(&common).chain(extra).map(|s| s.to_string()).collect() };
    let mut with_file = args(&["--input"]);
    with_file.push(input.clone());
    assert_eq!(kiln(&with_file), 0, "bench with the input from a file");
    assert_eq!(kiln(&args(&["--input-shape", "x=4,3,2"])), 0, "bench with sizes given");
    // With neither, the sizes are unknown: an error (exit 1), not a panic.
    assert_eq!(kiln(&args(&[])), 1, "bench with no sizes for a symbolic input");
    // `run` takes the same file.
    let out = dir.join("out");
    assert_eq!(kiln(&["run", m, "--device", "cpu", "--input", &input, "--output-dir", out.to_str().unwrap()]), 0, "run");
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
    assert_eq!(kiln(&["compile", m, "-o", a, "--no-cache", "--quiet"]), 0, "compile without --input-shape");
    for n in [1usize, 5, 8] {
        let xt = Tensor::random(DType::F32, &[n, 3], n as u64);
        let x = dir.join(format!("x{n}.npy"));
        std::fs::write(&x, kiln_ir::npy::encode(&xt).unwrap()).unwrap();
        let out = dir.join(format!("out{n}"));
        let input = format!("x={}", x.display());
        assert_eq!(kiln(&["run", a, "--input", &input, "--output-dir", out.to_str().unwrap(), "-q"]), 0, "run batch {n}");
        let y = kiln_ir::npy::decode(&std::fs::read(out.join("output_0.npy")).unwrap()).unwrap();
        let want: Vec<f32> = xt.as_slice::<f32>().unwrap().iter().map(|v| v.max(0.0)).collect();
        assert_eq!((y.dims(), y.as_slice::<f32>().unwrap()), (&[n, 3][..], &want[..]), "batch {n}");
    }
    let bench = ["bench", a, "--threads", "1", "--warmup", "0", "--iters", "1", "--quiet", "--input-shape"];
    assert_eq!(kiln(&[&bench[..], &["x=6,3"]].concat()), 0, "bench a batched artifact at batch 6");
    // A range: sizes outside it are refused at run time; a range that cannot hold is a usage error.
    assert_eq!(kiln(&["compile", m, "-o", a, "--no-cache", "--quiet", "--input-shape", "x=1..4,3"]), 0, "compile a range");
    assert_eq!(kiln(&[&bench[..], &["x=6,3"]].concat()), 1, "batch 6 outside 1..4");
    assert_eq!(kiln(&["compile", m, "-o", a, "--no-cache", "--quiet", "--input-shape", "x=4..2,3"]), 1, "an empty range");
    std::fs::remove_dir_all(&dir).unwrap();
}

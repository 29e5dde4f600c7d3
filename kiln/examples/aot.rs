//! Ahead of time: import an ONNX model, compile it for CPUs with AVX2 (x86-64-v3), save the
//! artifact, load it back and run it by input name. `cargo run -p kiln --example aot --features examples [MODEL]`;
//! without a model it builds a small one (y = softmax(x W)).

use kiln::{DType, Options, Tensor};

pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    run(std::env::args().nth(1))
}

pub fn run(model: Option<String>) -> Result<(), Box<dyn std::error::Error>> {
    let graph = match model {
        Some(path) => kiln::load_onnx(path)?,
        None => small_model(),
    };
    let options = Options::new().target_cpu("x86-64-v3".parse()?).threads(2);
    let artifact = kiln::compile(&graph, &options)?;
    let path = std::env::temp_dir().join(format!("kiln-aot-{}.kiln", std::process::id()));
    kiln::save_artifact(&artifact, &path)?;

    let model = kiln::load_artifact(&path, &options)?;
    std::fs::remove_file(&path)?;
    println!("loaded on {}", model.device());
    let inputs: Vec<(&str, Tensor)> = model
        .inputs()
        .iter()
        .map(|d| {
            let dtype = DType::from_name(&d.dtype).unwrap_or(DType::F32);
            (d.name.as_str(), Tensor::random(dtype, &d.dims, 7))
        })
        .collect();
    for (name, tensor) in model.run_named(&inputs)? {
        println!("{name}: {:?} {:?}", tensor.dtype(), tensor.dims());
    }

    // A wrong input name is an error that names it and lists the model's inputs.
    match model.run_named(&[("nope", Tensor::zeros(DType::F32, &[1]))]) {
        Err(e) => println!("as expected: {e}"),
        Ok(_) => return Err("an unknown input was accepted".into()),
    }
    Ok(())
}

fn small_model() -> kiln::Graph {
    let g = kiln::builder::GraphBuilder::new("small");
    let x = g.input("x", DType::F32, [4, 16]);
    let w = g.constant("w", Tensor::random(DType::F32, &[16, 8], 1));
    g.output("y", x.matmul(w).softmax(-1));
    g.build().expect("a well-formed graph")
}

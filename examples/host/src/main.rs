//! A host program using kiln: load an ONNX model (the path given, else one this program writes),
//! compile it in-process, run it by input name and print the outputs; then the same model
//! ahead of time, through an artifact file, checked to give the same numbers.

use kiln::{DType, Options, Tensor};

fn main() {
    if let Err(e) = run() {
        // The whole chain: what failed, and why underneath.
        eprint!("error: {e}");
        let mut source = std::error::Error::source(&*e);
        while let Some(s) = source {
            eprint!(": {s}");
            source = s.source();
        }
        eprintln!();
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let graph = match std::env::args().nth(1) {
        Some(path) => kiln::load_onnx(&path)?,
        None => {
            let g = kiln::builder::GraphBuilder::new("host-example");
            let x = g.input("x", DType::F32, [2, 8]);
            let w = g.constant("w", Tensor::random(DType::F32, &[8, 4], 1));
            g.output("y", x.matmul(w).sigmoid());
            g.build()?
        }
    };
    let options = Options::new().threads(2);
    let model = kiln::jit(&graph, &options)?;
    let inputs: Vec<(&str, Tensor)> = model
        .inputs()
        .iter()
        .map(|d| (d.name.as_str(), Tensor::random(DType::F32, &d.dims, 42)))
        .collect();
    let jit = model.run_named(&inputs)?;
    for (name, t) in &jit {
        println!("{name}: {:?} {:?}", t.dims(), &t.to_f64s()[..t.to_f64s().len().min(4)]);
    }

    let path = std::env::temp_dir().join(format!("kiln-host-{}.kiln", std::process::id()));
    kiln::save_artifact(&kiln::compile(&graph, &options)?, &path)?;
    let loaded = kiln::load_artifact(&path, &options);
    std::fs::remove_file(&path)?;
    let aot = loaded?.run_named(&inputs)?;
    for ((name, a), (_, b)) in aot.iter().zip(&jit) {
        if a.to_f64s() != b.to_f64s() {
            return Err(format!("output `{name}` differs between the JIT and the artifact").into());
        }
    }
    println!("ahead of time: the same {} output(s)", aot.len());
    Ok(())
}

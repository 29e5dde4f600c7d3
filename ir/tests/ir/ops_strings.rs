//! String tensors: the string ops (StringConcat, StringSplit, StringNormalizer, RegexFullMatch,
//! LabelEncoder), Equal and Cast on strings, movement ops on strings, the TensorProto and text
//! forms of string tensors, and the errors for bad input.
//!
//! Expected values are worked by hand from the ONNX spec and onnx.reference's rules (Python's
//! `str.split`, `re2.fullmatch`, a dict lookup for LabelEncoder).

use kiln_ir::builder::GraphBuilder;
use kiln_ir::op::BinaryOp;
use kiln_ir::{eval, DType, Op, Tensor};

fn strs(dims: &[usize], v: &[&str]) -> Tensor {
    Tensor::from_strings(dims, v.iter().map(|s| s.to_string()).collect()).unwrap()
}

fn texts(t: &Tensor) -> Vec<&str> {
    t.strings().expect("a string tensor").iter().map(String::as_str).collect()
}

/// Runs `op` on graph inputs of `inputs`; all its `n` results, or the graph's or the
/// interpreter's error.
fn go(op: Op, inputs: &[Tensor], n: usize) -> Result<Vec<Tensor>, String> {
    let g = GraphBuilder::new("t");
    let xs: Vec<_> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| Some(g.input(&format!("x{i}"), t.dtype(), t.dims())))
        .collect();
    for (i, y) in g.apply(op, &xs, n).into_iter().enumerate() {
        g.output(&format!("y{i}"), y);
    }
    let graph = g.build().map_err(|e| e.to_string())?;
    eval::run(&graph, inputs).map_err(|e| e.to_string())
}

#[track_caller]
fn run(op: Op, inputs: &[Tensor]) -> Tensor {
    go(op, inputs, 1).unwrap().remove(0)
}

#[track_caller]
fn fails(op: Op, inputs: &[Tensor], n: usize) -> String {
    match go(op, inputs, n) {
        Ok(r) => panic!("expected an error, got {r:?}"),
        Err(e) => e,
    }
}

fn split(delimiter: &str, maxsplit: Option<i64>) -> Op {
    Op::StringSplit { delimiter: delimiter.into(), maxsplit }
}

fn normalizer(case: &str, sensitive: bool, stopwords: &[&str]) -> Op {
    Op::StringNormalizer {
        case_change_action: case.into(),
        is_case_sensitive: sensitive,
        locale: String::new(),
        stopwords: stopwords.iter().map(|s| s.to_string()).collect(),
    }
}

#[test]
fn string_concat_broadcasts() {
    let y = run(Op::StringConcat, &[strs(&[2, 1], &["a", "b"]), strs(&[3], &["1", "", "的"])]);
    assert_eq!(y.dims(), &[2, 3]);
    assert_eq!(texts(&y), ["a1", "a", "a的", "b1", "b", "b的"]);
    let s = run(Op::StringConcat, &[strs(&[], &["cat"]), strs(&[], &["s"])]);
    assert_eq!((s.dims(), texts(&s)), (&[][..], vec!["cats"]));
}

#[test]
fn string_split_at_a_delimiter_pads_to_the_most_pieces() {
    let r = go(split("-", None), &[strs(&[3], &["a-b-c", "", "x--"])], 2).unwrap();
    assert_eq!(r[0].dims(), &[3, 3]);
    // Python: "".split("-") == [""], "x--".split("-") == ["x", "", ""].
    assert_eq!(texts(&r[0]), ["a", "b", "c", "", "", "", "x", "", ""]);
    assert_eq!(r[1].as_slice::<i64>().unwrap(), &[3, 1, 3]);
}

#[test]
fn string_split_at_whitespace_with_maxsplit() {
    // Python: " a  b c ".split(None, 1) == ["a", "b c "], "".split() == [].
    let r = go(split("", Some(1)), &[strs(&[2], &[" a  b c ", ""])], 2).unwrap();
    assert_eq!(r[0].dims(), &[2, 2]);
    assert_eq!(texts(&r[0]), ["a", "b c ", "", ""]);
    assert_eq!(r[1].as_slice::<i64>().unwrap(), &[2, 0]);
    // maxsplit 0 keeps each string whole.
    let r = go(split(".", Some(0)), &[strs(&[1], &["a.b"])], 2).unwrap();
    assert_eq!(texts(&r[0]), ["a.b"]);
}

#[test]
fn string_normalizer_drops_stopwords_then_changes_case() {
    let x = strs(&[4], &["Monday", "tuesday", "MONDAY", "Straße"]);
    let y = run(normalizer("UPPER", false, &["monday"]), &[x.clone()]);
    assert_eq!(texts(&y), ["TUESDAY", "STRASSE"]);
    // Case-sensitive: only the exact word goes.
    let y = run(normalizer("LOWER", true, &["MONDAY"]), &[x]);
    assert_eq!(texts(&y), ["monday", "tuesday", "straße"]);
    // [1, C] keeps its leading axis; nothing left gives one empty string.
    let y = run(normalizer("NONE", true, &["a"]), &[strs(&[1, 2], &["a", "a"])]);
    assert_eq!((y.dims(), texts(&y)), (&[1, 1][..], vec![""]));
}

#[test]
fn regex_full_match_matches_whole_strings() {
    let op = Op::RegexFullMatch { pattern: r"ab+|c\d".into() };
    let y = run(op, &[strs(&[2, 2], &["abbb", "abc", "c7", ""])]);
    assert_eq!(y.dims(), &[2, 2]);
    assert_eq!(y.as_slice::<bool>().unwrap(), &[true, false, true, false]);
}

#[test]
fn label_encoder_maps_strings_numbers_and_defaults() {
    let enc =
        |keys: Tensor, values: Tensor, default: Tensor| Op::LabelEncoder { keys, values, default };
    let to_int =
        enc(strs(&[3], &["a", "b", "a"]), Tensor::vector(&[1i64, 2, 3]), Tensor::vector(&[-1i64]));
    // A repeated key maps to its last value, as a dict built from the lists does.
    let y = run(to_int, &[strs(&[4], &["a", "b", "z", ""])]);
    assert_eq!(y.as_slice::<i64>().unwrap(), &[3, 2, -1, -1]);
    let to_text =
        enc(Tensor::vector(&[0i64, 1]), strs(&[2], &["cat", "dog"]), strs(&[1], &["_Unused"]));
    let y = run(to_text, &[Tensor::vector(&[1i64, 0, 7])]);
    assert_eq!(texts(&y), ["dog", "cat", "_Unused"]);
    // Float keys: NaN finds NaN, -0 finds 0.
    let floats = enc(
        Tensor::vector(&[f32::NAN, 0.0, 2.5]),
        Tensor::vector(&[1i16, 2, 3]),
        Tensor::vector(&[9i16]),
    );
    let y = run(floats, &[Tensor::vector(&[2.5f32, f32::NAN, -0.0, 1.0])]);
    assert_eq!(y.as_slice::<i16>().unwrap(), &[3, 1, 2, 9]);
}

#[test]
fn equal_compares_strings_with_broadcasting() {
    let y = run(
        Op::Binary(BinaryOp::Equal),
        &[strs(&[2, 2], &["a", "b", "c", "a"]), strs(&[1], &["a"])],
    );
    assert_eq!(y.as_slice::<bool>().unwrap(), &[true, false, false, true]);
}

#[test]
fn cast_between_strings_and_numbers() {
    let to_f32 = Op::Cast { to: DType::F32, saturate: true };
    let y = run(to_f32, &[strs(&[4], &["1.5", "-2", " 3 ", "-inf"])]);
    assert_eq!(y.as_slice::<f32>().unwrap(), &[1.5, -2.0, 3.0, f32::NEG_INFINITY]);
    let to_i64 = Op::Cast { to: DType::I64, saturate: true };
    let y = run(to_i64, &[strs(&[1], &["9007199254740993"])]);
    assert_eq!(y.as_slice::<i64>().unwrap(), &[9_007_199_254_740_993], "exact past 2^53");
    let to_text = Op::Cast { to: DType::String, saturate: true };
    let y = run(to_text.clone(), &[Tensor::vector(&[0.1f32, 2.0, f32::NAN])]);
    assert_eq!(texts(&y), ["0.1", "2.0", "nan"]);
    // numpy's astype(str), which ONNX's reference Cast uses: scientific outside [1e-4, 1e16),
    // a signed exponent of two digits or more; bools as True and False.
    let y =
        run(to_text.clone(), &[Tensor::vector(&[1e300f64, 1.5e-7, -1e16, 0.0001, f64::INFINITY])]);
    assert_eq!(texts(&y), ["1e+300", "1.5e-07", "-1e+16", "0.0001", "inf"]);
    let y = run(to_text.clone(), &[Tensor::vector(&[true, false])]);
    assert_eq!(texts(&y), ["True", "False"]);
    let y = run(to_text, &[Tensor::vector(&[-4i64, 12])]);
    assert_eq!(texts(&y), ["-4", "12"]);
    let e = fails(Op::Cast { to: DType::F32, saturate: true }, &[strs(&[1], &["abc"])], 1);
    assert!(e.contains("Cast") && e.contains("cannot cast the string \"abc\" to f32"), "{e}");
    // Integers strictly, as numpy reads them: no fraction, no exponent, in the type's range.
    let y = run(Op::Cast { to: DType::F32, saturate: true }, &[strs(&[2], &["nan", "1e999"])]);
    let v = y.as_slice::<f32>().unwrap();
    assert!(v[0].is_nan() && v[1] == f32::INFINITY, "{v:?}");
    let y =
        run(Op::Cast { to: DType::U64, saturate: true }, &[strs(&[1], &["18446744073709551615"])]);
    assert_eq!(y.as_slice::<u64>().unwrap(), &[u64::MAX]);
    for (bad, to) in
        [("1.5", DType::I64), ("1e3", DType::I32), ("300", DType::I8), ("-1", DType::U8)]
    {
        let e = fails(Op::Cast { to, saturate: true }, &[strs(&[1], &[bad])], 1);
        assert!(e.contains(&format!("cannot cast the string {bad:?} to {to}")), "{e}");
    }
}

#[test]
fn movement_ops_move_strings() {
    let x = strs(&[2, 3], &["a", "b", "c", "d", "e", "f"]);
    let t = run(Op::Transpose { perm: vec![1, 0] }, &[x.clone()]);
    assert_eq!((t.dims(), texts(&t)), (&[3, 2][..], vec!["a", "d", "b", "e", "c", "f"]));
    let g = run(Op::Gather { axis: 1 }, &[x.clone(), Tensor::vector(&[2i64, 0])]);
    assert_eq!(texts(&g), ["c", "a", "f", "d"]);
    let c = run(Op::Concat { axis: 0 }, &[x.clone(), strs(&[1, 3], &["x", "y", "z"])]);
    assert_eq!(texts(&c), ["a", "b", "c", "d", "e", "f", "x", "y", "z"]);
    let cond = Tensor::from_vec(&[2, 1], vec![true, false]).unwrap();
    let w = run(Op::Where, &[cond, x, strs(&[], &["-"])]);
    assert_eq!(texts(&w), ["a", "b", "c", "-", "-", "-"]);
}

#[test]
fn bad_string_input_is_an_error_naming_the_node() {
    let keys = strs(&[2], &["a", "b"]);
    let e = fails(
        Op::LabelEncoder {
            keys,
            values: Tensor::vector(&[1i64]),
            default: Tensor::vector(&[0i64]),
        },
        &[strs(&[1], &["a"])],
        1,
    );
    assert!(
        e.contains("LabelEncoder") && e.contains("keys and values must be 1-D and of one length"),
        "{e}"
    );
    let e = fails(Op::RegexFullMatch { pattern: "(a".into() }, &[strs(&[1], &["a"])], 1);
    assert!(e.contains("RegexFullMatch") && e.contains("is not a valid regular expression"), "{e}");
    // A pattern cannot reach past the anchors it is put between: `a)|(?:b` is not a pattern.
    let e = fails(Op::RegexFullMatch { pattern: "a)|(?:b".into() }, &[strs(&[1], &["ab"])], 1);
    assert!(e.contains("is not a valid regular expression"), "{e}");
    let e = fails(Op::Binary(BinaryOp::Equal), &[strs(&[1], &["a"]), Tensor::vector(&[1f32])], 1);
    assert!(e.contains("Equal") && e.contains("same element type"), "{e}");
    let e = fails(Op::Binary(BinaryOp::Add), &[strs(&[1], &["a"]), strs(&[1], &["b"])], 1);
    assert!(e.contains("Add") && e.contains("needs a numeric type"), "{e}");
    let e = fails(Op::StringConcat, &[strs(&[1], &["a"]), Tensor::vector(&[1f32])], 1);
    assert!(e.contains("StringConcat") && e.contains("operand 1 must be strings"), "{e}");
    let e = fails(normalizer("TITLE", false, &[]), &[strs(&[1], &["a"])], 1);
    assert!(e.contains("case_change_action must be LOWER, UPPER or NONE"), "{e}");
    let e = fails(normalizer("NONE", false, &[]), &[strs(&[2, 2], &["a", "b", "c", "d"])], 1);
    assert!(e.contains("x must be [C] or [1, C]"), "{e}");
}

/// A negative maxsplit is no limit (Python's and ONNX's reference rule); the pieces are counted
/// before any is made.
#[test]
fn string_split_with_a_negative_maxsplit_splits_everywhere() {
    let y = go(split(",", Some(-1)), &[strs(&[2], &["a,b,c", "d"])], 2).unwrap();
    assert_eq!((y[0].dims(), texts(&y[0])), (&[2, 3][..], vec!["a", "b", "c", "d", "", ""]));
    assert_eq!(y[1].as_slice::<i64>().unwrap(), &[3, 1]);
}

/// A pattern's flags and comments stay inside it: `(?x)` with a comment still matches whole
/// strings only.
#[test]
fn regex_flags_and_comments_stay_inside_the_pattern() {
    let y = run(
        Op::RegexFullMatch { pattern: "(?x) a b # the letters".into() },
        &[strs(&[3], &["ab", "abc", "xab"])],
    );
    assert_eq!(y.as_slice::<bool>().unwrap(), &[true, false, false]);
}

/// Shape and Size read a string tensor's dims.
#[test]
fn shape_and_size_of_strings() {
    let x = strs(&[2, 3], &["a", "b", "c", "d", "e", "f"]);
    let s = run(Op::Shape { start: 0, end: None }, &[x.clone()]);
    assert_eq!(s.as_slice::<i64>().unwrap(), &[2, 3]);
    let n = run(Op::Size, &[x]);
    assert_eq!(n.as_slice::<i64>().unwrap(), &[6]);
}

/// A result whose text would not fit in memory is refused before it is made: each element of an
/// Expand or StringConcat holds its own copy of the text.
#[test]
fn strings_larger_than_memory_are_refused() {
    let long = "x".repeat(1 << 20);
    let g = GraphBuilder::new("t");
    let x = g.input("x", DType::String, [1]);
    let shape = g.constant("shape", Tensor::vector(&[1i64 << 20]));
    g.output("y", g.apply(Op::Expand, &[Some(x), Some(shape)], 1)[0]);
    let e = eval::run(&g.build().unwrap(), &[strs(&[1], &[&long])]).unwrap_err().to_string();
    assert!(
        e.contains("Expand") && e.contains("strings need") && e.contains("of memory available"),
        "{e}"
    );
    let e = fails(
        Op::StringConcat,
        &[
            strs(&[1 << 10, 1], &vec![long.as_str(); 1 << 10]),
            strs(&[1, 1 << 10], &vec!["y"; 1 << 10]),
        ],
        1,
    );
    assert!(e.contains("StringConcat") && e.contains("of memory available"), "{e}");
}

/// SplitToSequence and ConcatFromSequence move strings as they move numbers.
#[test]
fn sequence_splits_and_joins_move_strings() {
    use kiln_ir::op::SequenceOp;
    let g = GraphBuilder::new("t");
    let x = g.input("x", DType::String, [4]);
    let s = g.apply(Op::Sequence(SequenceOp::Split { axis: 0, keepdims: true }), &[Some(x)], 1)[0];
    let y =
        g.apply(Op::Sequence(SequenceOp::Concat { axis: 0, new_axis: false }), &[Some(s)], 1)[0];
    g.output("y", y);
    let out = eval::run(&g.build().unwrap(), &[strs(&[4], &["a", "b", "c", "d"])]).unwrap();
    assert_eq!(texts(&out[0]), ["a", "b", "c", "d"]);
}

#[test]
fn string_tensors_have_no_bytes() {
    let t = strs(&[2], &["a", "b"]);
    assert!(t.bytes().is_empty());
    assert!(t.as_slice::<u8>().is_err());
    assert!(Tensor::from_bytes(DType::String, &[1], &[0; 8]).is_err());
    assert!(t.index_axis(0, 0).is_err());
    assert!(Tensor::from_strings(&[3], vec!["a".into()]).is_err());
    assert_ne!(t, strs(&[2], &["a", "c"]));
    assert_ne!(t.digest(), strs(&[2], &["a", "c"]).digest());
}

#[test]
fn string_tensor_protos_round_trip_and_refuse_bad_data() {
    use kiln_ir::onnx::proto::TensorProto;
    use prost::Message;
    let t = strs(&[2, 2], &["a", "", "的", "x y"]);
    let back = kiln_ir::onnx::decode_tensor(&kiln_ir::onnx::encode_tensor(&t, "s"), None).unwrap();
    assert_eq!(back, t);
    let proto = |data: Vec<Vec<u8>>, dims: Vec<i64>| {
        TensorProto {
            name: Some("words".into()),
            data_type: Some(8),
            dims,
            string_data: data,
            ..Default::default()
        }
        .encode_to_vec()
    };
    let e = kiln_ir::onnx::decode_tensor(&proto(vec![b"a".to_vec()], vec![2]), None).unwrap_err();
    assert!(
        e.to_string().contains("tensor `words`")
            && e.to_string().contains("needs 2 strings, the file holds 1"),
        "{e}"
    );
    let e =
        kiln_ir::onnx::decode_tensor(&proto(vec![vec![0xff, 0xfe]], vec![1]), None).unwrap_err();
    assert!(e.to_string().contains("tensor `words`") && e.to_string().contains("not UTF-8"), "{e}");
}

#[test]
fn string_constants_round_trip_through_the_text_form() {
    let g = GraphBuilder::new("t");
    let x = g.input("x", DType::String, [2]);
    let k = g.constant("k", strs(&[2], &["quote \" and \\", "line\nbreak"]));
    let y = g.apply(Op::StringConcat, &[Some(x), Some(k)], 1)[0];
    g.output("y", y);
    let graph = g.build().unwrap();
    let text = kiln_ir::text::print(&graph, kiln_ir::text::Weights::Full);
    let back = kiln_ir::text::parse(&text).unwrap();
    let out = eval::run(&back, &[strs(&[2], &["a", "b"])]).unwrap();
    assert_eq!(texts(&out[0]), ["aquote \" and \\", "bline\nbreak"]);
}

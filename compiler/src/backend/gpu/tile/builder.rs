//! Building a `gpu.func` op by op, as MLIR's C++ `OpBuilder` does: an insertion block, ops
//! appended to its end, values as plain handles. The tile kernels are written with it; every op
//! is built with melior's `OperationBuilder` (nothing is parsed but attribute spellings).
//!
//! Values are raw `MlirValue`s: a kernel's code nests loops and branches freely, and melior's
//! lifetimes (a value borrows the block that made it) would make every nested region a closure
//! over borrowed blocks. The handles are valid while the device module lives; a builder only
//! appends, never erases, so nothing it hands out dangles.

use melior::ir::attribute::{
    DenseI32ArrayAttribute, FloatAttribute, IntegerAttribute, StringAttribute, TypeAttribute,
};
use melior::ir::operation::OperationBuilder;
use melior::ir::r#type::{FunctionType, IntegerType, MemRefType};
use melior::ir::{
    Attribute, Block, BlockRef, Identifier, Location, Region, RegionLike, Type, TypeLike, Value,
};
use melior::Context;
use mlir_sys::{MlirBlock, MlirType, MlirValue};

use crate::backend::edit::RawOp;
use crate::codegen::scalar::ScalarBuilder;

/// A value in the kernel being built.
pub type V = MlirValue;

/// Which lowering the kernel goes through: what it may use (warp shuffles and tensor cores are
/// NVIDIA's; OpenCL kernels exchange values through workgroup memory instead).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Flavor {
    Nvvm,
    Spirv,
}

/// Threads of a warp (NVIDIA) and of the groups the OpenCL flavour reduces through memory.
pub const WARP: usize = 32;

/// Appends ops at the end of one block of a kernel.
pub struct KernelBuilder<'c> {
    pub ctx: &'c Context,
    pub loc: Location<'c>,
    block: MlirBlock,
    pub flavor: Flavor,
}

fn value<'c>(v: V) -> Value<'c, 'static> {
    // SAFETY: a live value of the module being built (see the module comment).
    unsafe { Value::from_raw(v) }
}

fn ty<'c>(t: MlirType) -> Type<'c> {
    // SAFETY: a live type of this context.
    unsafe { Type::from_raw(t) }
}

/// The type of a value.
pub fn type_of(v: V) -> MlirType {
    // SAFETY: a live value.
    unsafe { mlir_sys::mlirValueGetType(v) }
}

impl<'c> KernelBuilder<'c> {
    /// A builder appending to `block`.
    pub fn at(ctx: &'c Context, block: MlirBlock, flavor: Flavor) -> KernelBuilder<'c> {
        KernelBuilder { ctx, loc: Location::unknown(ctx), block, flavor }
    }

    fn nested(&self, block: MlirBlock) -> KernelBuilder<'c> {
        KernelBuilder { ctx: self.ctx, loc: self.loc, block, flavor: self.flavor }
    }

    fn attr(&self, s: &str) -> Attribute<'c> {
        Attribute::parse(self.ctx, s).unwrap_or_else(|| panic!("kiln spells `{s}` right"))
    }

    /// Appends `name` and returns it. Building fails only on a malformed op, a bug here.
    pub fn op(
        &self,
        name: &str,
        operands: &[V],
        results: &[MlirType],
        attrs: &[(&str, Attribute<'c>)],
        regions: Vec<Region<'c>>,
    ) -> RawOp {
        let operands: Vec<Value> = operands.iter().map(|&v| value(v)).collect();
        let results: Vec<Type> = results.iter().map(|&t| ty(t)).collect();
        let attrs: Vec<(Identifier, Attribute)> =
            attrs.iter().map(|(n, a)| (Identifier::new(self.ctx, n), *a)).collect();
        let op = OperationBuilder::new(name, self.loc)
            .add_operands(&operands)
            .add_results(&results)
            .add_attributes(&attrs)
            .add_regions_vec(regions)
            .build()
            .unwrap_or_else(|e| panic!("building {name}: {e}"));
        let raw = op.into_raw();
        // SAFETY: the block is live; it takes ownership of the new op.
        unsafe { mlir_sys::mlirBlockAppendOwnedOperation(self.block, raw) };
        RawOp(raw)
    }

    /// Appends an op with one result and returns it.
    pub fn op1(
        &self,
        name: &str,
        operands: &[V],
        result: MlirType,
        attrs: &[(&str, Attribute<'c>)],
    ) -> V {
        self.op(name, operands, &[result], attrs, Vec::new()).result(0)
    }

    /// Runs `f` with a `ScalarBuilder` appending here (the elementwise ops' scalar code).
    pub fn scalar<R>(&self, f: impl FnOnce(&ScalarBuilder<'c, '_>) -> R) -> R {
        // SAFETY: the insertion block is live for the whole call.
        let block = unsafe { BlockRef::from_raw(self.block) };
        let sb = ScalarBuilder { ctx: self.ctx, loc: self.loc, block: &block };
        f(&sb)
    }

    // Types.

    pub fn index_t(&self) -> MlirType {
        Type::index(self.ctx).to_raw()
    }
    pub fn f32_t(&self) -> MlirType {
        Type::float32(self.ctx).to_raw()
    }
    pub fn int_t(&self, bits: u32) -> MlirType {
        Type::from(IntegerType::new(self.ctx, bits)).to_raw()
    }
    pub fn vector_t(&self, n: usize, elem: MlirType) -> MlirType {
        Type::vector(&[n as u64], ty(elem)).to_raw()
    }
    pub fn vector2_t(&self, rows: usize, cols: usize, elem: MlirType) -> MlirType {
        Type::vector(&[rows as u64, cols as u64], ty(elem)).to_raw()
    }
    /// A flat `memref<n x elem>` in global memory (a kernel argument).
    pub fn buffer_t(&self, n: usize, elem: MlirType) -> MlirType {
        Type::from(MemRefType::new(ty(elem), &[n as i64], None, None)).to_raw()
    }

    // Constants.

    pub fn index(&self, v: i64) -> V {
        let t = self.index_t();
        let a = IntegerAttribute::new(ty(t), v).into();
        self.op1("arith.constant", &[], t, &[("value", a)])
    }
    pub fn int(&self, v: i64, bits: u32) -> V {
        let t = self.int_t(bits);
        let a = IntegerAttribute::new(ty(t), v).into();
        self.op1("arith.constant", &[], t, &[("value", a)])
    }
    /// A float constant of type `t`.
    pub fn float(&self, v: f64, t: MlirType) -> V {
        let a = FloatAttribute::new(self.ctx, ty(t), v).into();
        self.op1("arith.constant", &[], t, &[("value", a)])
    }
    pub fn f32(&self, v: f64) -> V {
        self.float(v, self.f32_t())
    }
    /// A vector of `n` copies of `x`.
    pub fn splat(&self, x: V, n: usize) -> V {
        self.op1("vector.broadcast", &[x], self.vector_t(n, type_of(x)), &[])
    }

    // Index arithmetic (non-negative values: unsigned division).

    pub fn add(&self, a: V, b: V) -> V {
        self.op1("arith.addi", &[a, b], type_of(a), &[])
    }
    pub fn sub(&self, a: V, b: V) -> V {
        self.op1("arith.subi", &[a, b], type_of(a), &[])
    }
    pub fn mul(&self, a: V, b: V) -> V {
        self.op1("arith.muli", &[a, b], type_of(a), &[])
    }
    pub fn div(&self, a: V, b: V) -> V {
        self.op1("arith.divui", &[a, b], type_of(a), &[])
    }
    pub fn rem(&self, a: V, b: V) -> V {
        self.op1("arith.remui", &[a, b], type_of(a), &[])
    }
    pub fn min(&self, a: V, b: V) -> V {
        self.op1("arith.minui", &[a, b], type_of(a), &[])
    }
    /// `a + k` for a constant `k` (nothing when `k` is 0).
    pub fn add_k(&self, a: V, k: i64) -> V {
        if k == 0 {
            return a;
        }
        let c = self.index(k);
        self.add(a, c)
    }
    /// `a * k` for a constant `k`.
    pub fn mul_k(&self, a: V, k: i64) -> V {
        if k == 1 {
            return a;
        }
        let c = self.index(k);
        self.mul(a, c)
    }
    pub fn div_k(&self, a: V, k: i64) -> V {
        if k == 1 {
            return a;
        }
        let c = self.index(k);
        self.div(a, c)
    }
    pub fn rem_k(&self, a: V, k: i64) -> V {
        let c = self.index(k);
        self.rem(a, c)
    }
    /// An integer comparison (`ult`, `eq`...), giving an i1.
    pub fn cmp(&self, pred: &str, a: V, b: V) -> V {
        let p = match pred {
            "eq" => 0,
            "ne" => 1,
            "slt" => 2,
            "sle" => 3,
            "sgt" => 4,
            "sge" => 5,
            "ult" => 6,
            "ule" => 7,
            "ugt" => 8,
            "uge" => 9,
            other => panic!("no integer predicate {other}"),
        };
        let a64 = IntegerAttribute::new(Type::from(IntegerType::new(self.ctx, 64)), p).into();
        self.op1("arith.cmpi", &[a, b], self.int_t(1), &[("predicate", a64)])
    }
    /// `a < k` (unsigned) for a constant `k`.
    pub fn lt_k(&self, a: V, k: i64) -> V {
        let c = self.index(k);
        self.cmp("ult", a, c)
    }
    pub fn and(&self, a: V, b: V) -> V {
        self.op1("arith.andi", &[a, b], type_of(a), &[])
    }
    pub fn select(&self, c: V, a: V, b: V) -> V {
        // SPIR-V 1.0 selects vectors by a vector of conditions only.
        // SAFETY: live values' types.
        let c = unsafe {
            let (tc, ta) = (type_of(c), type_of(a));
            if mlir_sys::mlirTypeIsAVector(ta) && !mlir_sys::mlirTypeIsAVector(tc) {
                self.splat(c, mlir_sys::mlirShapedTypeGetDimSize(ta, 0) as usize)
            } else {
                c
            }
        };
        self.op1("arith.select", &[c, a, b], type_of(a), &[])
    }
    pub fn index_cast(&self, v: V, to: MlirType) -> V {
        self.op1("arith.index_castui", &[v], to, &[])
    }

    // Float arithmetic (any float type, scalar or vector).

    /// A binary float op (`arith.addf`, `arith.maximumf`...).
    pub fn fop(&self, name: &str, a: V, b: V) -> V {
        self.op1(name, &[a, b], type_of(a), &[])
    }
    /// A unary op keeping the type (`math.exp`, `math.sqrt`...).
    pub fn fun(&self, name: &str, a: V) -> V {
        self.op1(name, &[a], type_of(a), &[])
    }
    pub fn fma(&self, a: V, b: V, c: V) -> V {
        self.op1("math.fma", &[a, b, c], type_of(a), &[])
    }

    // GPU ids and synchronisation.

    fn dim_attr(&self, d: usize) -> Attribute<'c> {
        self.attr(&format!("#gpu<dim {}>", ["x", "y", "z"][d]))
    }
    pub fn thread_id(&self, d: usize) -> V {
        self.op1("gpu.thread_id", &[], self.index_t(), &[("dimension", self.dim_attr(d))])
    }
    pub fn block_id(&self, d: usize) -> V {
        self.op1("gpu.block_id", &[], self.index_t(), &[("dimension", self.dim_attr(d))])
    }
    /// Every thread of the block waits here; workgroup memory written before is visible after.
    pub fn barrier(&self) {
        self.op("gpu.barrier", &[], &[], &[], Vec::new());
    }
    /// The value lane `lane ^ offset` holds (NVVM only): `gpu.shuffle xor` over 32 lanes.
    pub fn shuffle_xor(&self, v: V, offset: u32) -> V {
        assert_eq!(self.flavor, Flavor::Nvvm, "shuffles are NVIDIA's");
        let off = self.int(offset as i64, 32);
        let width = self.int(WARP as i64, 32);
        let t = type_of(v);
        self.op(
            "gpu.shuffle",
            &[v, off, width],
            &[t, self.int_t(1)],
            &[("mode", self.attr("#gpu<shuffle_mode xor>"))],
            Vec::new(),
        )
        .result(0)
    }

    // Memory.

    /// A workgroup-memory array of `n` elements (one per block, shared by its threads).
    pub fn shared(&self, n: usize, elem: MlirType) -> V {
        let space = IntegerAttribute::new(Type::from(IntegerType::new(self.ctx, 64)), 3).into();
        let t = Type::from(MemRefType::new(ty(elem), &[n as i64], None, Some(space))).to_raw();
        let seg = DenseI32ArrayAttribute::new(self.ctx, &[0, 0]).into();
        self.op1("memref.alloc", &[], t, &[("operandSegmentSizes", seg)])
    }
    pub fn load(&self, mem: V, i: V) -> V {
        // SAFETY: a memref type.
        let elem = unsafe { mlir_sys::mlirShapedTypeGetElementType(type_of(mem)) };
        self.op1("memref.load", &[mem, i], elem, &[])
    }
    pub fn store(&self, v: V, mem: V, i: V) {
        self.op("memref.store", &[v, mem, i], &[], &[], Vec::new());
    }
    /// `n` consecutive elements from `i` as a vector; `align` is the bytes the address is known
    /// to be aligned to (16 lets NVPTX load 128 bits at once).
    pub fn vload(&self, mem: V, i: V, n: usize, align: usize) -> V {
        // SAFETY: a memref type.
        let elem = unsafe { mlir_sys::mlirShapedTypeGetElementType(type_of(mem)) };
        let a = IntegerAttribute::new(Type::from(IntegerType::new(self.ctx, 64)), align as i64);
        self.op1("vector.load", &[mem, i], self.vector_t(n, elem), &[("alignment", a.into())])
    }
    pub fn vstore(&self, v: V, mem: V, i: V, align: usize) {
        let a = IntegerAttribute::new(Type::from(IntegerType::new(self.ctx, 64)), align as i64);
        self.op("vector.store", &[v, mem, i], &[], &[("alignment", a.into())], Vec::new());
    }
    /// Element `k` of a 1-D vector.
    pub fn extract(&self, vec: V, k: usize) -> V {
        // SAFETY: a vector type.
        let elem = unsafe { mlir_sys::mlirShapedTypeGetElementType(type_of(vec)) };
        let pos = melior::ir::attribute::DenseI64ArrayAttribute::new(self.ctx, &[k as i64]);
        self.op1("vector.extract", &[vec], elem, &[("static_position", pos.into())])
    }
    /// A 1-D vector of the given elements.
    pub fn from_elements(&self, elems: &[V]) -> V {
        let t = self.vector_t(elems.len(), type_of(elems[0]));
        self.op1("vector.from_elements", elems, t, &[])
    }

    // Control flow.

    /// `scf.for` from `lo` to `hi` by `step` carrying `inits`; `body` gets the induction variable
    /// and the carried values and returns the next ones. Returns the final carried values.
    pub fn for_loop(
        &self,
        lo: V,
        hi: V,
        step: V,
        inits: &[V],
        body: impl FnOnce(&KernelBuilder<'c>, V, &[V]) -> Vec<V>,
    ) -> Vec<V> {
        if self.flavor == Flavor::Spirv && !inits.is_empty() {
            return self.for_loop_in_memory(lo, hi, step, inits, body);
        }
        let mut args: Vec<(Type, Location)> = vec![(ty(self.index_t()), self.loc)];
        args.extend(inits.iter().map(|&v| (ty(type_of(v)), self.loc)));
        let block = Block::new(&args);
        let raw = block.to_raw();
        let inner = self.nested(raw);
        // SAFETY: arguments of the block just made.
        let (iv, carried): (V, Vec<V>) = unsafe {
            (
                mlir_sys::mlirBlockGetArgument(raw, 0),
                (0..inits.len())
                    .map(|i| mlir_sys::mlirBlockGetArgument(raw, 1 + i as isize))
                    .collect(),
            )
        };
        let next = body(&inner, iv, &carried);
        assert_eq!(next.len(), inits.len(), "a loop yields what it carries");
        inner.op("scf.yield", &next, &[], &[], Vec::new());
        let region = Region::new();
        region.append_block(block);
        let mut operands = vec![lo, hi, step];
        operands.extend_from_slice(inits);
        let types: Vec<MlirType> = inits.iter().map(|&v| type_of(v)).collect();
        let op = self.op("scf.for", &operands, &types, &[], vec![region]);
        (0..inits.len()).map(|i| op.result(i)).collect()
    }

    /// `for_loop` for SPIR-V, carrying its values in per-thread memory: MLIR's conversion of
    /// `scf.for` to SPIR-V stores the carried values only in the loop's body, so a loop that
    /// runs no trip returns undefined values (a NaN sum of an empty share).
    fn for_loop_in_memory(
        &self,
        lo: V,
        hi: V,
        step: V,
        inits: &[V],
        body: impl FnOnce(&KernelBuilder<'c>, V, &[V]) -> Vec<V>,
    ) -> Vec<V> {
        let zero = self.index(0);
        let cells: Vec<V> = inits
            .iter()
            .map(|&v| {
                let t = Type::from(MemRefType::new(ty(type_of(v)), &[1], None, None)).to_raw();
                let seg = DenseI32ArrayAttribute::new(self.ctx, &[0, 0]).into();
                let cell = self.op1("memref.alloc", &[], t, &[("operandSegmentSizes", seg)]);
                self.store(v, cell, zero);
                cell
            })
            .collect();
        let block = Block::new(&[(ty(self.index_t()), self.loc)]);
        let raw = block.to_raw();
        let inner = self.nested(raw);
        // SAFETY: the argument of the block just made.
        let iv = unsafe { mlir_sys::mlirBlockGetArgument(raw, 0) };
        let zero_in = inner.index(0);
        let carried: Vec<V> = cells.iter().map(|&c| inner.load(c, zero_in)).collect();
        let next = body(&inner, iv, &carried);
        assert_eq!(next.len(), inits.len(), "a loop yields what it carries");
        for (&v, &c) in next.iter().zip(&cells) {
            inner.store(v, c, zero_in);
        }
        inner.op("scf.yield", &[], &[], &[], Vec::new());
        let region = Region::new();
        region.append_block(block);
        self.op("scf.for", &[lo, hi, step], &[], &[], vec![region]);
        cells.iter().map(|&c| self.load(c, zero)).collect()
    }

    /// A loop over constant bounds.
    pub fn for_range(
        &self,
        lo: i64,
        hi: i64,
        step: i64,
        inits: &[V],
        body: impl FnOnce(&KernelBuilder<'c>, V, &[V]) -> Vec<V>,
    ) -> Vec<V> {
        let (l, h, s) = (self.index(lo), self.index(hi), self.index(step));
        self.for_loop(l, h, s, inits, body)
    }

    /// `scf.if` yielding values of `types`: `then` and `otherwise` each return them.
    pub fn if_else(
        &self,
        cond: V,
        types: &[MlirType],
        then: impl FnOnce(&KernelBuilder<'c>) -> Vec<V>,
        otherwise: impl FnOnce(&KernelBuilder<'c>) -> Vec<V>,
    ) -> Vec<V> {
        let branch = |f: &dyn Fn(&KernelBuilder<'c>) -> Vec<V>| {
            let block = Block::new(&[]);
            let inner = self.nested(block.to_raw());
            let ys = f(&inner);
            inner.op("scf.yield", &ys, &[], &[], Vec::new());
            let region = Region::new();
            region.append_block(block);
            region
        };
        let then = std::cell::RefCell::new(Some(then));
        let otherwise = std::cell::RefCell::new(Some(otherwise));
        let r1 = branch(&|kb| (then.borrow_mut().take().expect("once"))(kb));
        let r2 = branch(&|kb| (otherwise.borrow_mut().take().expect("once"))(kb));
        let op = self.op("scf.if", &[cond], types, &[], vec![r1, r2]);
        (0..types.len()).map(|i| op.result(i)).collect()
    }

    /// `scf.if` without results or else branch.
    pub fn when(&self, cond: V, then: impl FnOnce(&KernelBuilder<'c>)) {
        let block = Block::new(&[]);
        let inner = self.nested(block.to_raw());
        then(&inner);
        inner.op("scf.yield", &[], &[], &[], Vec::new());
        let region = Region::new();
        region.append_block(block);
        self.op("scf.if", &[cond], &[], &[], vec![region, Region::new()]);
    }

    /// A value loaded only when `cond` holds, else `otherwise`.
    pub fn load_or(&self, cond: V, mem: V, i: V, otherwise: V) -> V {
        let t = type_of(otherwise);
        self.if_else(cond, &[t], |kb| vec![kb.load(mem, i)], |_| vec![otherwise])[0]
    }
}

/// Builds a kernel `gpu.func` named `name` at the end of `device` (the `gpu.module`'s body)
/// taking `args` (flat buffers, bare pointers when lowered), with `block` threads a block;
/// `body` fills it given the arguments.
pub fn kernel_func<'c>(
    ctx: &'c Context,
    device: MlirBlock,
    flavor: Flavor,
    name: &str,
    args: &[MlirType],
    block: [u32; 3],
    body: impl FnOnce(&KernelBuilder<'c>, &[V]),
) -> RawOp {
    let loc = Location::unknown(ctx);
    let arg_types: Vec<Type> = args.iter().map(|&t| ty(t)).collect();
    let entry = Block::new(&arg_types.iter().map(|&t| (t, loc)).collect::<Vec<_>>());
    let raw = entry.to_raw();
    let kb = KernelBuilder::at(ctx, raw, flavor);
    // SAFETY: arguments of the block just made.
    let params: Vec<V> = (0..args.len())
        .map(|i| unsafe { mlir_sys::mlirBlockGetArgument(raw, i as isize) })
        .collect();
    body(&kb, &params);
    kb.op("gpu.return", &[], &[], &[], Vec::new());
    let region = Region::new();
    region.append_block(entry);
    let fty = FunctionType::new(ctx, &arg_types, &[]);
    let sizes = [block[0] as i32, block[1] as i32, block[2] as i32];
    let op = OperationBuilder::new("gpu.func", loc)
        .add_attributes(&[
            (Identifier::new(ctx, "sym_name"), StringAttribute::new(ctx, name).into()),
            (Identifier::new(ctx, "function_type"), TypeAttribute::new(fty.into()).into()),
            (Identifier::new(ctx, "gpu.kernel"), Attribute::unit(ctx)),
            (
                Identifier::new(ctx, "known_block_size"),
                DenseI32ArrayAttribute::new(ctx, &sizes).into(),
            ),
        ])
        .add_regions([region])
        .build()
        .unwrap_or_else(|e| panic!("building gpu.func {name}: {e}"));
    let raw = op.into_raw();
    // SAFETY: the device module's body takes ownership of the new function.
    unsafe { mlir_sys::mlirBlockAppendOwnedOperation(device, raw) };
    RawOp(raw)
}

/// Whether `v` is a float type's value.
pub fn is_float(v: V) -> bool {
    // SAFETY: a live value's type.
    unsafe { mlir_sys::mlirTypeIsAFloat(type_of(v)) }
}

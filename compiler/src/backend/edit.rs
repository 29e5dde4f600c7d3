//! Editing MLIR in place through the C API: walking operations, reading operands, types and
//! attributes, replacing values, moving and erasing operations. The targets' surgery on IR
//! (tagging ops for transform scripts, reading launch plans, legalising memory spaces) goes
//! through these few calls, so the `unsafe` stays here.
//!
//! A `RawOp` is a handle, not an owner: it is valid while its module lives and the op has not
//! been erased; callers keep to that (they hold the module for the whole edit).

use melior::ir::operation::OperationRef;
use melior::ir::{Attribute, AttributeLike, Type};
use mlir_sys::{MlirAttribute, MlirOperation, MlirStringRef, MlirType, MlirValue};

/// An operation handle.
#[derive(Clone, Copy)]
pub struct RawOp(pub MlirOperation);

impl PartialEq for RawOp {
    fn eq(&self, other: &RawOp) -> bool {
        self.0.ptr == other.0.ptr
    }
}

impl std::fmt::Debug for RawOp {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "{}", self.name())
    }
}

pub fn string_ref(s: &str) -> MlirStringRef {
    MlirStringRef { data: s.as_ptr() as *const _, length: s.len() }
}

impl RawOp {
    /// The handle of a melior operation.
    pub fn of<'c: 'a, 'a>(op: &impl melior::ir::operation::OperationLike<'c, 'a>) -> RawOp {
        RawOp(op.to_raw())
    }

    pub fn name(self) -> String {
        // SAFETY: a live op (see the module comment); the identifier outlives the call.
        unsafe {
            let id = mlir_sys::mlirOperationGetName(self.0);
            let s = mlir_sys::mlirIdentifierStr(id);
            String::from_utf8_lossy(std::slice::from_raw_parts(s.data as *const u8, s.length))
                .into_owned()
        }
    }

    pub fn is(self, name: &str) -> bool {
        self.name() == name
    }

    /// The operations directly inside this op's regions, in order.
    pub fn children(self) -> Vec<RawOp> {
        let mut out = Vec::new();
        // SAFETY: walking a live op's regions, blocks and ops without changing them.
        unsafe {
            for r in 0..mlir_sys::mlirOperationGetNumRegions(self.0) {
                let region = mlir_sys::mlirOperationGetRegion(self.0, r);
                let mut block = mlir_sys::mlirRegionGetFirstBlock(region);
                while !block.ptr.is_null() {
                    let mut op = mlir_sys::mlirBlockGetFirstOperation(block);
                    while !op.ptr.is_null() {
                        out.push(RawOp(op));
                        op = mlir_sys::mlirOperationGetNextInBlock(op);
                    }
                    block = mlir_sys::mlirBlockGetNextInRegion(block);
                }
            }
        }
        out
    }

    /// Every op nested in this one (not itself), outer before inner.
    pub fn descendants(self) -> Vec<RawOp> {
        let mut out = Vec::new();
        let mut stack: Vec<RawOp> = self.children().into_iter().rev().collect();
        while let Some(op) = stack.pop() {
            out.push(op);
            stack.extend(op.children().into_iter().rev());
        }
        out
    }

    pub fn num_operands(self) -> usize {
        // SAFETY: a live op.
        unsafe { mlir_sys::mlirOperationGetNumOperands(self.0) as usize }
    }

    pub fn operand(self, i: usize) -> MlirValue {
        assert!(i < self.num_operands(), "operand {i} of {}", self.name());
        // SAFETY: in range, checked above.
        unsafe { mlir_sys::mlirOperationGetOperand(self.0, i as isize) }
    }

    pub fn operands(self) -> Vec<MlirValue> {
        (0..self.num_operands()).map(|i| self.operand(i)).collect()
    }

    pub fn set_operand(self, i: usize, v: MlirValue) {
        assert!(i < self.num_operands(), "operand {i} of {}", self.name());
        // SAFETY: in range; the caller passes a value of the operand's type that dominates it.
        unsafe { mlir_sys::mlirOperationSetOperand(self.0, i as isize, v) }
    }

    pub fn num_results(self) -> usize {
        // SAFETY: a live op.
        unsafe { mlir_sys::mlirOperationGetNumResults(self.0) as usize }
    }

    pub fn result(self, i: usize) -> MlirValue {
        assert!(i < self.num_results(), "result {i} of {}", self.name());
        // SAFETY: in range, checked above.
        unsafe { mlir_sys::mlirOperationGetResult(self.0, i as isize) }
    }

    pub fn attr(self, name: &str) -> Option<MlirAttribute> {
        // SAFETY: a live op; a null attribute means absent.
        let a = unsafe { mlir_sys::mlirOperationGetAttributeByName(self.0, string_ref(name)) };
        (!a.ptr.is_null()).then_some(a)
    }

    /// Sets an attribute (inherent ones go to the op's properties).
    pub fn set_attr(self, name: &str, value: MlirAttribute) {
        // SAFETY: a live op and an attribute of its context.
        unsafe { mlir_sys::mlirOperationSetAttributeByName(self.0, string_ref(name), value) }
    }

    pub fn set_unit_attr(self, ctx: &melior::Context, name: &str) {
        self.set_attr(name, Attribute::unit(ctx).to_raw());
    }

    pub fn remove_attr(self, name: &str) {
        // SAFETY: a live op.
        unsafe { mlir_sys::mlirOperationRemoveAttributeByName(self.0, string_ref(name)) };
    }

    pub fn parent(self) -> Option<RawOp> {
        // SAFETY: a live op; null when it has no parent.
        let p = unsafe { mlir_sys::mlirOperationGetParentOperation(self.0) };
        (!p.ptr.is_null()).then_some(RawOp(p))
    }

    /// Whether `self` is nested (at any depth) inside `ancestor`.
    pub fn is_inside(self, ancestor: RawOp) -> bool {
        let mut p = self.parent();
        while let Some(op) = p {
            if op == ancestor {
                return true;
            }
            p = op.parent();
        }
        false
    }

    /// A copy of the op (not yet in any block).
    pub fn clone_op(self) -> RawOp {
        // SAFETY: cloning a live op; the caller inserts the clone into a block.
        RawOp(unsafe { mlir_sys::mlirOperationClone(self.0) })
    }

    /// Erases the op; its results must have no uses left.
    pub fn erase(self) {
        // SAFETY: the caller drops every handle to it; the op is owned by its block.
        unsafe { mlir_sys::mlirOperationDestroy(self.0) }
    }

    /// Moves the op to the end of `block` (`block` may belong to another module of the same
    /// context).
    pub fn move_to_end(self, block: mlir_sys::MlirBlock) {
        // SAFETY: a live op, detached from its block and then owned by `block`.
        unsafe {
            mlir_sys::mlirOperationRemoveFromParent(self.0);
            mlir_sys::mlirBlockAppendOwnedOperation(block, self.0);
        }
    }

    pub fn text(self) -> String {
        // SAFETY: printing a live op.
        unsafe { OperationRef::from_raw(self.0) }.to_string()
    }

    /// The first block of region `r`.
    pub fn block(self, r: usize) -> Option<mlir_sys::MlirBlock> {
        // SAFETY: a live op; region index checked.
        unsafe {
            if r >= mlir_sys::mlirOperationGetNumRegions(self.0) as usize {
                return None;
            }
            let b = mlir_sys::mlirRegionGetFirstBlock(mlir_sys::mlirOperationGetRegion(
                self.0, r as isize,
            ));
            (!b.ptr.is_null()).then_some(b)
        }
    }
}

/// The op defining `v` (none for block arguments).
pub fn defining_op(v: MlirValue) -> Option<RawOp> {
    // SAFETY: a live value.
    unsafe {
        if !mlir_sys::mlirValueIsAOpResult(v) {
            return None;
        }
        Some(RawOp(mlir_sys::mlirOpResultGetOwner(v)))
    }
}

/// The op owning the block `v` is an argument of, with the argument's position.
pub fn block_argument_owner(v: MlirValue) -> Option<(RawOp, usize)> {
    // SAFETY: a live value.
    unsafe {
        if !mlir_sys::mlirValueIsABlockArgument(v) {
            return None;
        }
        let block = mlir_sys::mlirBlockArgumentGetOwner(v);
        let op = mlir_sys::mlirBlockGetParentOperation(block);
        Some((RawOp(op), mlir_sys::mlirBlockArgumentGetArgNumber(v) as usize))
    }
}

/// The number of arguments of the first block of `op`'s first region.
pub fn block_argument_count(op: RawOp) -> Option<usize> {
    let b = op.block(0)?;
    // SAFETY: a live block.
    Some(unsafe { mlir_sys::mlirBlockGetNumArguments(b) } as usize)
}

/// The ops using `v` (an op using it twice appears twice).
pub fn users(v: MlirValue) -> Vec<RawOp> {
    let mut out = Vec::new();
    // SAFETY: iterating a live value's use list.
    unsafe {
        let mut u = mlir_sys::mlirValueGetFirstUse(v);
        while !u.ptr.is_null() {
            out.push(RawOp(mlir_sys::mlirOpOperandGetOwner(u)));
            u = mlir_sys::mlirOpOperandGetNextUse(u);
        }
    }
    out
}

pub fn value_type(v: MlirValue) -> MlirType {
    // SAFETY: a live value.
    unsafe { mlir_sys::mlirValueGetType(v) }
}

pub fn set_value_type(v: MlirValue, t: MlirType) {
    // SAFETY: callers only retype values whose users accept any type of that kind.
    unsafe { mlir_sys::mlirValueSetType(v, t) }
}

/// Replaces the uses of `old` by ops nested in `scope` with `new`.
pub fn replace_uses_inside(old: MlirValue, new: MlirValue, scope: RawOp) {
    // SAFETY: walking and editing a live value's use list; each use is changed once, after the
    // next one was read.
    unsafe {
        let mut u = mlir_sys::mlirValueGetFirstUse(old);
        while !u.ptr.is_null() {
            let next = mlir_sys::mlirOpOperandGetNextUse(u);
            let owner = RawOp(mlir_sys::mlirOpOperandGetOwner(u));
            if owner.is_inside(scope) {
                let i = mlir_sys::mlirOpOperandGetOperandNumber(u);
                mlir_sys::mlirOperationSetOperand(owner.0, i as isize, new);
            }
            u = next;
        }
    }
}

pub fn replace_uses(old: MlirValue, new: MlirValue) {
    // SAFETY: both live; `new` dominates the uses (the caller's business).
    unsafe { mlir_sys::mlirValueReplaceAllUsesOfWith(old, new) }
}

pub fn same_value(a: MlirValue, b: MlirValue) -> bool {
    a.ptr == b.ptr
}

pub fn type_text(t: MlirType) -> String {
    // SAFETY: a live type.
    unsafe { Type::from_raw(t) }.to_string()
}

/// Static dimensions of a shaped type (`None` for a dynamic one or a non-shaped type).
pub fn static_dims(t: MlirType) -> Option<Vec<usize>> {
    // SAFETY: querying a live type.
    unsafe {
        if !mlir_sys::mlirTypeIsAShaped(t) || !mlir_sys::mlirShapedTypeHasRank(t) {
            return None;
        }
        let rank = mlir_sys::mlirShapedTypeGetRank(t) as isize;
        let mut dims = Vec::with_capacity(rank as usize);
        for i in 0..rank {
            if mlir_sys::mlirShapedTypeIsDynamicDim(t, i) {
                return None;
            }
            dims.push(mlir_sys::mlirShapedTypeGetDimSize(t, i) as usize);
        }
        Some(dims)
    }
}

/// The element type's size in bytes (i1 counts as one byte, as kiln stores bools).
pub fn element_bytes(t: MlirType) -> Option<usize> {
    // SAFETY: querying a live type.
    unsafe {
        if !mlir_sys::mlirTypeIsAShaped(t) {
            return None;
        }
        let e = mlir_sys::mlirShapedTypeGetElementType(t);
        if mlir_sys::mlirTypeIsAInteger(e) {
            return Some((mlir_sys::mlirIntegerTypeGetWidth(e) as usize).div_ceil(8));
        }
        if mlir_sys::mlirTypeIsAFloat(e) {
            return Some((mlir_sys::mlirFloatTypeGetWidth(e) as usize).div_ceil(8));
        }
        if mlir_sys::mlirTypeIsAIndex(e) {
            return Some(8);
        }
        None
    }
}

pub fn parse_attr(ctx: &melior::Context, s: &str) -> Option<MlirAttribute> {
    Attribute::parse(ctx, s).map(|a| a.to_raw())
}

/// An integer attribute's value.
pub fn int_attr(a: MlirAttribute) -> Option<i64> {
    // SAFETY: querying a live attribute.
    unsafe { mlir_sys::mlirAttributeIsAInteger(a).then(|| mlir_sys::mlirIntegerAttrGetValueInt(a)) }
}

/// The value of an `arith.constant` of integer or index type defining `v`.
pub fn constant_int(v: MlirValue) -> Option<i64> {
    let op = defining_op(v)?;
    if !op.is("arith.constant") {
        return None;
    }
    int_attr(op.attr("value")?)
}

/// A float attribute's value, or a dense splat's (`dense<3.0> : vector<16xf32>`).
pub fn float_attr(a: MlirAttribute) -> Option<f64> {
    // SAFETY: querying a live attribute.
    unsafe {
        let a = if mlir_sys::mlirAttributeIsADenseElements(a)
            && mlir_sys::mlirDenseElementsAttrIsSplat(a)
        {
            mlir_sys::mlirDenseElementsAttrGetSplatValue(a)
        } else {
            a
        };
        mlir_sys::mlirAttributeIsAFloat(a).then(|| mlir_sys::mlirFloatAttrGetValueDouble(a))
    }
}

/// A string or flat symbol reference attribute's text (`"k0"`, `@k0` -> `k0`).
pub fn string_attr(a: MlirAttribute) -> Option<String> {
    // SAFETY: querying a live attribute; the string is copied out.
    unsafe {
        let s = if mlir_sys::mlirAttributeIsAString(a) {
            mlir_sys::mlirStringAttrGetValue(a)
        } else if mlir_sys::mlirAttributeIsAFlatSymbolRef(a) {
            mlir_sys::mlirFlatSymbolRefAttrGetValue(a)
        } else {
            return None;
        };
        Some(
            String::from_utf8_lossy(std::slice::from_raw_parts(s.data as *const u8, s.length))
                .into_owned(),
        )
    }
}

/// The elements of a `array<i32: ...>` attribute.
pub fn i32_array_attr(a: MlirAttribute) -> Option<Vec<i32>> {
    // SAFETY: querying a live attribute.
    unsafe {
        if !mlir_sys::mlirAttributeIsADenseI32Array(a) {
            return None;
        }
        Some(
            (0..mlir_sys::mlirDenseArrayGetNumElements(a))
                .map(|i| mlir_sys::mlirDenseI32ArrayGetElement(a, i))
                .collect(),
        )
    }
}

/// The elements of an array attribute.
pub fn array_attr(a: MlirAttribute) -> Option<Vec<MlirAttribute>> {
    // SAFETY: querying a live attribute.
    unsafe {
        if !mlir_sys::mlirAttributeIsAArray(a) {
            return None;
        }
        Some(
            (0..mlir_sys::mlirArrayAttrGetNumElements(a))
                .map(|i| mlir_sys::mlirArrayAttrGetElement(a, i))
                .collect(),
        )
    }
}

/// True when `a` is the attribute `text` parses to in `a`'s context (e.g. `#gpu.thread<x>`).
pub fn attr_is(a: MlirAttribute, text: &str) -> bool {
    // SAFETY: a live attribute and its context; the parsed attribute is uniqued in it.
    unsafe {
        let ctx = mlir_sys::mlirAttributeGetContext(a);
        let b = mlir_sys::mlirAttributeParseGet(ctx, string_ref(text));
        !b.ptr.is_null() && mlir_sys::mlirAttributeEqual(a, b)
    }
}

/// A shaped type's element type.
pub fn element_type(t: MlirType) -> Option<MlirType> {
    // SAFETY: querying a live type.
    unsafe { mlir_sys::mlirTypeIsAShaped(t).then(|| mlir_sys::mlirShapedTypeGetElementType(t)) }
}

/// A memref type's memory space (`None`: the default).
pub fn memory_space(t: MlirType) -> Option<MlirAttribute> {
    // SAFETY: querying a live type.
    unsafe {
        if !mlir_sys::mlirTypeIsAMemRef(t) {
            return None;
        }
        let s = mlir_sys::mlirMemRefTypeGetMemorySpace(t);
        (!s.ptr.is_null()).then_some(s)
    }
}

/// A static memref of `dims` and `element`, contiguous, in memory space `space` (`None`: the
/// default).
pub fn contiguous_memref(
    element: MlirType,
    dims: &[usize],
    space: Option<MlirAttribute>,
) -> MlirType {
    let shape: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
    // SAFETY: a live element type; a null attribute is the default memory space.
    unsafe {
        let space = space.unwrap_or(MlirAttribute { ptr: std::ptr::null() });
        mlir_sys::mlirMemRefTypeContiguousGet(element, shape.len() as isize, shape.as_ptr(), space)
    }
}

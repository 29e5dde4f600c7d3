"""Training with kiln: one compiled step (forward, loss, gradients and the optimizer's update),
parameters and optimizer state kept by the runtime between steps.

    import numpy as np, kiln.training
    ts = kiln.training.TrainSession("cnn.onnx", ["conv.weight", "fc.weight", "fc.bias"],
                                    "sgd", logits="logits", lr=0.01, momentum=0.9)
    for x, y in batches:                      # float32 images, int64 class numbers
        loss = ts.step(x, y)
    ts.save_onnx("cnn-trained.onnx")          # the model with the trained initializers

``TrainSession(model, params, optimizer="sgd", *, loss=None, logits=None, lr=0.01,
momentum=0.0, nesterov=False, weight_decay=0.0, betas=(0.9, 0.999), eps=1e-8, device="cpu",
threads=None, precision="f32")``: ``model`` an ONNX file or bytes; ``params`` the initializers
to train; ``precision="bf16"`` is mixed precision (every Conv, ConvTranspose, MatMul and Gemm of
the step, forward and backward, multiplies bf16-rounded operands and sums in f32; parameters,
optimizer state, loss and normalisation stay f32; CPU only; ``"f16"`` is refused: it would
need a loss scale);
``optimizer`` ``"sgd"``, ``"adam"`` or ``"adamw"`` (PyTorch's meanings); the loss is the scalar
output ``loss=``, or softmax cross-entropy of the ``[batch, classes]`` output ``logits=`` against
an added int64 input ``labels``. ``step(*batch)`` takes numpy arrays in ``batch_names`` order and
returns the loss before the update; ``param(name)``, ``set_param(name, value)``, ``params()``,
``running_stats()`` (each training-mode BatchNormalization's running mean and variance by
initializer name, as each step updates them; ``save_onnx`` writes them with the parameters),
``lr`` (settable: no recompilation), ``steps``. Errors are ``kiln.KilnError`` naming the input,
parameter or output at fault. Rust's ``kiln_compiler::TrainSession`` is the same session.
"""

from ._kiln import TrainSession

__all__ = ["TrainSession"]

"""Image classifiers for the examples and benchmarks, each returning logits.

- `mlp`: Dense 512-256 on the flattened image.
- `cnn`: a ResNet-style network: a strided stem convolution, a residual stage at 14x14 and one at
  7x7 (each 3x3 convolutions with BatchNorm, the second stage entered through a strided projection
  shortcut), then a wide dense head, as VGG and AlexNet carry most of their weights in dense layers.
  3.36 M parameters for 28x28x1 inputs, 95 % of them in the head.
- `vit`: a small Vision Transformer: 7x7 patches (16 tokens for 28x28 inputs), a learned position
  embedding, pre-norm transformer blocks (multi-head self-attention and a GELU MLP, each with a
  residual connection), mean pooling over the tokens and a linear head. 1.61 M parameters.

Both are sized for the time-to-accuracy benchmark's emulated 4-host cluster on a CPU: their
gradients (12.8 and 6.1 MiB) take longer to allreduce at 1 Gbit/s per host than a step's compute.
"""

import tensorflow as tf

__all__ = ["MODELS", "build_model"]

MODELS = ("mlp", "cnn", "vit")
_CNN_WIDTHS = (32, 64)     # channels of the 14x14 and the 7x7 stage
_CNN_HEAD = 1024           # units of the dense head
_VIT_PATCH = 7
_VIT_DIM = 256
_VIT_DEPTH = 2
_VIT_HEADS = 4
_VIT_MLP = 1024


def _conv_bn(x, filters: int, strides: int = 1, relu: bool = True):
    x = tf.keras.layers.Conv2D(filters, 3, strides=strides, padding="same", use_bias=False)(x)
    x = tf.keras.layers.BatchNormalization()(x)
    return tf.keras.layers.ReLU()(x) if relu else x


def _residual_block(x, filters: int, strides: int = 1):
    """Two 3x3 convolutions with BatchNorm; the shortcut is a strided 1x1 projection where the
    shape changes."""
    shortcut = x
    if strides != 1 or x.shape[-1] != filters:
        shortcut = tf.keras.layers.Conv2D(filters, 1, strides=strides, use_bias=False)(x)
        shortcut = tf.keras.layers.BatchNormalization()(shortcut)
    x = _conv_bn(x, filters, strides)
    x = _conv_bn(x, filters, relu=False)
    return tf.keras.layers.ReLU()(tf.keras.layers.Add()([x, shortcut]))


def _cnn(inputs, num_classes: int):
    x = _conv_bn(inputs, _CNN_WIDTHS[0], strides=2)            # 14x14
    x = _residual_block(x, _CNN_WIDTHS[0])
    x = _residual_block(x, _CNN_WIDTHS[1], strides=2)          # 7x7
    x = tf.keras.layers.Flatten()(x)
    x = tf.keras.layers.Dense(_CNN_HEAD, activation="relu")(x)
    x = tf.keras.layers.Dropout(0.3)(x)
    return tf.keras.layers.Dense(num_classes)(x)


class _PositionEmbedding(tf.keras.layers.Layer):
    """Adds a learned [tokens, dim] embedding to [batch, tokens, dim] inputs."""

    def build(self, input_shape):
        self.embedding = self.add_weight(name="embedding", shape=input_shape[1:],
                                         initializer=tf.keras.initializers.RandomNormal(stddev=0.02))

    def call(self, x):
        return x + self.embedding


def _vit(inputs, num_classes: int):
    x = tf.keras.layers.Conv2D(_VIT_DIM, _VIT_PATCH, strides=_VIT_PATCH)(inputs)  # patch embedding
    x = tf.keras.layers.Reshape((-1, _VIT_DIM))(x)
    x = _PositionEmbedding()(x)
    for _ in range(_VIT_DEPTH):
        y = tf.keras.layers.LayerNormalization(epsilon=1e-6)(x)
        y = tf.keras.layers.MultiHeadAttention(_VIT_HEADS, _VIT_DIM // _VIT_HEADS)(y, y)
        x = tf.keras.layers.Add()([x, y])
        y = tf.keras.layers.LayerNormalization(epsilon=1e-6)(x)
        y = tf.keras.layers.Dense(_VIT_MLP, activation="gelu")(y)
        y = tf.keras.layers.Dense(_VIT_DIM)(y)
        x = tf.keras.layers.Add()([x, y])
    x = tf.keras.layers.LayerNormalization(epsilon=1e-6)(x)
    x = tf.keras.layers.GlobalAveragePooling1D()(x)
    return tf.keras.layers.Dense(num_classes)(x)


def build_model(kind: str, input_shape, num_classes: int = 10) -> tf.keras.Model:
    """The classifier `kind` (one of MODELS) for float32 images of `input_shape` [h, w, c],
    returning [batch, num_classes] logits."""
    if kind not in MODELS:
        raise ValueError(f"kind: {kind!r} is not one of {', '.join(MODELS)}")
    inputs = tf.keras.Input(tuple(input_shape))
    if kind == "mlp":
        x = tf.keras.layers.Flatten()(inputs)
        x = tf.keras.layers.Dense(512, activation="relu")(x)
        x = tf.keras.layers.Dense(256, activation="relu")(x)
        outputs = tf.keras.layers.Dense(num_classes)(x)
    elif kind == "cnn":
        outputs = _cnn(inputs, num_classes)
    else:
        if input_shape[0] % _VIT_PATCH or input_shape[1] % _VIT_PATCH:
            raise ValueError(f"input_shape: {tuple(input_shape)} is not a multiple of the {_VIT_PATCH}x{_VIT_PATCH} patches")
        outputs = _vit(inputs, num_classes)
    return tf.keras.Model(inputs, outputs, name=kind)

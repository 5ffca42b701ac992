"""The one place that owns the op library's compiler and linker flags."""

load("@local_config_tf//:build_info.bzl", "TF_COPTS", "TF_VERSION")

# Flags from tf.sysconfig (C++ standard, ABI, Eigen alignment) plus ours. The hot loops are plain C++
# written to auto-vectorise, hence -O3; no -march so the library runs on any x86-64.
TFCOMP_COPTS = TF_COPTS + [
    "-O3",
    "-fvisibility=hidden",
    "-Wall",
    "-Wno-sign-compare",
    "-DTFCOMP_TF_VERSION=\\\"%s\\\"" % TF_VERSION,
]

def tfcomp_cc_library(name, copts = [], **kwargs):
    """A cc_library compiled with the op library's flags."""
    native.cc_library(name = name, copts = TFCOMP_COPTS + copts, **kwargs)

def tfcomp_op_library(name, deps = [], **kwargs):
    """The shared object TensorFlow loads with tf.load_op_library."""
    native.cc_binary(
        name = name,
        linkshared = 1,
        linkopts = ["-Wl,--no-undefined", "-Wl,-rpath,$$ORIGIN"],
        deps = deps + [
            "@local_config_tf//:libtensorflow_framework",
            "@local_config_tf//:tf_header_lib",
        ],
        copts = TFCOMP_COPTS,
        **kwargs
    )

"""Repository rule that exposes the local CUDA toolkit to the CUDA build (--config=cuda), offline.

Only the CUDA build refers to it, so a CPU-only build never runs it and needs no nvcc. It finds
nvcc (TFCOMP_NVCC, else nvcc on PATH) and the toolkit (TFCOMP_CUDA_PATH, else the directory above
nvcc's bin/, else /usr/local/cuda), and writes a repository with:

  //:nvcc          a wrapper script that runs that nvcc
  //:cuda_headers  cc_library of the toolkit's include/ (cuda_runtime_api.h, ...)
  //:cudart_static cc_library of libcudart_static.a, so the op library needs no libcudart.so
"""

def _cuda_configure_impl(ctx):
    nvcc = ctx.os.environ.get("TFCOMP_NVCC") or ctx.which("nvcc")
    if not nvcc:
        fail("\n[cuda_configure] --config=cuda needs nvcc: put it on PATH or set TFCOMP_NVCC.\n")
    nvcc = str(nvcc)
    candidates = [
        ctx.os.environ.get("TFCOMP_CUDA_PATH", ""),
        str(ctx.path(nvcc).realpath.dirname.dirname),
        "/usr/local/cuda",
    ]
    root = None
    for candidate in candidates:
        if candidate and ctx.path(candidate + "/include/cuda_runtime_api.h").exists:
            root = candidate
            break
    if not root:
        fail("\n[cuda_configure] no CUDA toolkit (include/cuda_runtime_api.h) in %s; set TFCOMP_CUDA_PATH.\n" % candidates)
    cudart = None
    for lib in ["lib64", "lib", "targets/x86_64-linux/lib"]:
        if ctx.path(root + "/" + lib + "/libcudart_static.a").exists:
            cudart = root + "/" + lib + "/libcudart_static.a"
            break
    if not cudart:
        fail("\n[cuda_configure] no libcudart_static.a under %s.\n" % root)

    ctx.symlink(root + "/include", "include")
    ctx.symlink(cudart, "lib/libcudart_static.a")
    ctx.file("nvcc", "#!/bin/sh\nexec '%s' \"$@\"\n" % nvcc, executable = True)
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

exports_files(["nvcc"])

cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp", "include/**/*.cuh", "include/**/*.inl"]),
    includes = ["include"],
)

cc_library(
    name = "cudart_static",
    srcs = ["lib/libcudart_static.a"],
    linkopts = ["-ldl", "-lpthread", "-lrt"],
)
""")

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["TFCOMP_NVCC", "TFCOMP_CUDA_PATH", "PATH"],
    local = True,
)

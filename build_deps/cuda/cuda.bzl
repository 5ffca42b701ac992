"""cuda_objects: compiles CUDA sources with nvcc into PIC objects for a cc_library (Bazel 4 has no
CUDA rules). The nvcc comes from @local_config_cuda (cuda_configure.bzl). GPU architectures:
--define=tfcomp_cuda_archs=80;90 (the default: A100 and H100, plus PTX of the last for newer GPUs).
"""

def _cuda_objects_impl(ctx):
    archs = ctx.var.get("tfcomp_cuda_archs", "80;90").split(";")
    gencode = []
    for arch in archs:
        gencode += ["-gencode", "arch=compute_%s,code=sm_%s" % (arch, arch)]
    gencode += ["-gencode", "arch=compute_%s,code=compute_%s" % (archs[-1], archs[-1])]
    objects = []
    for src in ctx.files.srcs:
        obj = ctx.actions.declare_file("%s/%s.pic.o" % (ctx.label.name, src.basename.replace(".cu.cc", "")))
        ctx.actions.run(
            executable = ctx.executable._nvcc,
            arguments = ["-std=c++17", "-O3", "-x", "cu", "-I.", "-Xcompiler", "-fPIC,-fvisibility=hidden,-Wall"] +
                        gencode + ctx.attr.copts + ["-c", src.path, "-o", obj.path],
            inputs = ctx.files.srcs + ctx.files.hdrs,
            outputs = [obj],
            mnemonic = "NvccCompile",
            progress_message = "nvcc %s" % src.short_path,
            use_default_shell_env = True,
        )
        objects.append(obj)
    return [DefaultInfo(files = depset(objects))]

cuda_objects = rule(
    implementation = _cuda_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu.cc"]),
        "hdrs": attr.label_list(allow_files = True),
        "copts": attr.string_list(),
        "_nvcc": attr.label(default = "@local_config_cuda//:nvcc", executable = True, cfg = "host", allow_single_file = True),
    },
)

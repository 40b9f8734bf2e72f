"""A repository rule exposing Debian's system libraries as cc_library targets.

For each entry of `libs` it runs `pkg-config --cflags/--libs` (or takes raw
linker flags) and writes a cc_library with the link options, the -D defines,
and any -I directories outside /usr/include symlinked into the repository.
The result is cached like any local repository; `bazel sync` refreshes it.
"""

def _dedup(items):
    seen = {}
    out = []
    for it in items:
        if it not in seen:
            seen[it] = True
            out.append(it)
    return out

def _pkg_config(ctx, args):
    res = ctx.execute(["pkg-config"] + args)
    if res.return_code != 0:
        fail("pkg-config %s failed: %s\nInstall the Debian -dev package (see README.md)." %
             (" ".join(args), res.stderr))
    return res.stdout.strip().split(" ")

def _impl(ctx):
    lines = ['package(default_visibility = ["//visibility:public"])', ""]
    for name, spec in ctx.attr.libs.items():
        defines = []
        includes = []
        if spec.startswith("raw:"):
            linkopts = spec[len("raw:"):].split(" ")
        else:
            mods = spec.split(" ")
            cflags = _pkg_config(ctx, ["--cflags"] + mods)
            linkopts = _pkg_config(ctx, ["--libs"] + mods)
            for i, flag in enumerate(cflags):
                if flag.startswith("-D"):
                    defines.append(flag[2:])
                elif flag.startswith("-I"):
                    path = flag[2:].rstrip("/")
                    if path and path != "/usr/include":
                        link = "include_%s_%d" % (name, i)
                        ctx.symlink(path, link)
                        includes.append(link)
        linkopts = _dedup([f for f in linkopts if f])
        lines.append("cc_library(")
        lines.append('    name = "%s",' % name)
        lines.append("    hdrs = glob([%s], allow_empty = True)," %
                     ", ".join(['"%s/**"' % d for d in includes]))
        lines.append("    includes = %s," % repr(includes))
        lines.append("    defines = %s," % repr(_dedup(defines)))
        lines.append("    linkopts = %s," % repr(linkopts))
        lines.append(")")
        lines.append("")
    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)
    ctx.file("BUILD", "\n".join(lines))

system_libraries = repository_rule(
    implementation = _impl,
    attrs = {"libs": attr.string_dict(mandatory = True)},
    local = True,
    environ = ["PKG_CONFIG_PATH"],
)

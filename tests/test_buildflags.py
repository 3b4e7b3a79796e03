"""buildflags: CPU flags -> llama.cpp CMAKE_ARGS, system_info parsing, and doctor's build check."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from sprinter_edge.backend import buildflags, native
from sprinter_edge.cli import models as models_cli

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "sprinter_edge" / "backend" / "buildflags.py"


def cpuinfo_flags(line: str) -> list[str]:
    return line.split()


# /proc/cpuinfo "flags" lines as Linux prints them (note "avx512vbmi" without underscore).
SAPPHIRE_RAPIDS = cpuinfo_flags(
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ss "
    "ht syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid tsc_known_freq "
    "pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer aes xsave avx "
    "f16c rdrand hypervisor lahf_lm abm 3dnowprefetch ssbd ibrs ibpb stibp ibrs_enhanced fsgsbase "
    "tsc_adjust bmi1 avx2 smep bmi2 erms invpcid avx512f avx512dq rdseed adx smap avx512ifma clflushopt "
    "clwb avx512cd sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves avx_vnni avx512_bf16 wbnoinvd "
    "ida arat avx512vbmi umip pku ospke waitpkg avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni "
    "avx512_bitalg tme avx512_vpopcntdq rdpid cldemote movdiri movdir64b md_clear serialize amx_bf16 "
    "avx512_fp16 amx_tile amx_int8 flush_l1d arch_capabilities"
)
ZEN5 = cpuinfo_flags(
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht "
    "syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid "
    "extd_apicid tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt aes "
    "xsave avx f16c rdrand hypervisor lahf_lm cmp_legacy cr8_legacy abm sse4a misalignsse 3dnowprefetch "
    "osvw topoext fsgsbase bmi1 avx2 smep bmi2 erms invpcid avx512f avx512dq rdseed adx smap avx512ifma "
    "clflushopt clwb avx512cd sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves avx_vnni avx512_bf16 "
    "clzero xsaveerptr arat avx512vbmi umip pku ospke avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni "
    "avx512_bitalg avx512_vpopcntdq rdpid movdiri movdir64b fsrm avx512_vp2intersect"
)
# This session's AMD EPYC (Zen 3): AVX2 but no AVX-512, AVX-VNNI or AMX.
ZEN3 = cpuinfo_flags(
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht "
    "syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid "
    "extd_apicid tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt "
    "tsc_deadline_timer aes xsave avx f16c rdrand hypervisor lahf_lm cmp_legacy cr8_legacy abm sse4a "
    "misalignsse 3dnowprefetch osvw topoext vmmcall fsgsbase tsc_adjust bmi1 avx2 smep bmi2 erms invpcid "
    "rdseed adx smap clflushopt clwb sha_ni xsaveopt xsavec xgetbv1 xsaves clzero xsaveerptr arat umip "
    "vaes vpclmulqdq rdpid fsrm"
)
# llama_print_system_info() of the portable AVX2 build of llama-cpp-python 0.3.36.
PORTABLE_INFO = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
                 "LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | ")
ALL_AVX512 = ("AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16")


def options(args: str) -> dict[str, str]:
    return dict(re.fullmatch(r"-D(\w+)=(\w+)", a).groups() for a in args.split())


def test_sapphire_rapids_keeps_avx512_and_turns_amx_off():
    opts = options(buildflags.recommend("Linux", "x86_64", SAPPHIRE_RAPIDS, nvidia=False).cmake_args)
    assert opts["GGML_NATIVE"] == "OFF"
    assert {opts[k] for k in ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")} == {"OFF"}
    for on in ("GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2", "GGML_AVX_VNNI",
               "GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16"):
        assert opts[on] == "ON", on


def test_zen5_gets_every_avx512_option():
    opts = options(buildflags.x86_cmake_args(ZEN5))
    assert all(opts["GGML_" + f] == "ON" for f in ALL_AVX512)
    assert opts["GGML_AMX_INT8"] == "OFF"


def test_zen3_is_the_portable_avx2_build_with_everything_else_explicitly_off():
    args = buildflags.x86_cmake_args(ZEN3)
    assert args == ("-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON "
                    "-DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF "
                    "-DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF "
                    "-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF")


def test_avx512_needs_the_five_subsets_ggml_compiles_with():
    # A Xeon Phi has avx512f but not vl/dq/bw, and GGML_AVX512 compiles with all five.
    knl = [f for f in SAPPHIRE_RAPIDS if f not in ("avx512vl", "avx512dq", "avx512bw")]
    opts = options(buildflags.x86_cmake_args(knl))
    assert all(opts["GGML_" + f] == "OFF" for f in ALL_AVX512)
    assert opts["GGML_AVX2"] == "ON"


def test_other_platforms():
    assert buildflags.recommend("Darwin", "arm64").cmake_args == "-DGGML_METAL=on -DGGML_RPC=ON"
    cuda = buildflags.recommend("Linux", "x86_64", ZEN3, nvidia=True).cmake_args
    assert cuda.startswith("-DGGML_CUDA=on ") and "-DGGML_AMX_INT8=OFF" in cuda
    assert cuda.endswith(" -DGGML_RPC=ON")
    assert buildflags.recommend("Linux", "aarch64", [], nvidia=False).cmake_args == "-DGGML_RPC=ON"


def test_read_cpu_flags_parses_proc_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: " + " ".join(SAPPHIRE_RAPIDS)
                       + "\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    flags = buildflags.read_cpu_flags(str(cpuinfo))
    assert "amx_int8" in flags and "avx512_vbmi" in flags and "fpu" in flags
    assert buildflags.read_cpu_flags(str(tmp_path / "missing")) == frozenset()


def test_wheel_key_follows_version_and_flags_only():
    args = buildflags.x86_cmake_args(ZEN3)
    key = buildflags.wheel_key(args)
    assert re.fullmatch(r"[0-9a-f]{12}", key)
    assert buildflags.wheel_key("  " + args.replace(" ", "   ") + " ") == key
    assert buildflags.wheel_key(buildflags.x86_cmake_args(ZEN5)) != key
    assert buildflags.wheel_key(args, "0.3.37") != key


def test_parse_real_system_info_from_the_installed_build():
    info = native.system_info()
    parsed = buildflags.parse_system_info(info)
    assert "CPU" in parsed
    features = buildflags.build_features(info)
    assert {"REPACK", "SSE3"} <= features
    if "avx2" in buildflags.read_cpu_flags():
        assert "AVX2" in features
    # The build runs here, so it cannot use an instruction set this CPU lacks.
    assert buildflags.check_build(info).unsupported == ()


def test_parse_other_formats():
    info = "CUDA : ARCHS = 890 | USE_GRAPHS = 1 | CPU : SSE3 = 1 | AVX2 = 1 | AMX_INT8 = 1 | OPENMP = 1 | "
    parsed = buildflags.parse_system_info(info)
    assert parsed["CUDA"] == {"ARCHS": "890", "USE_GRAPHS": "1"}
    assert buildflags.build_features(info) == {"SSE3", "AVX2", "AMX_INT8", "OPENMP"}
    old = "AVX = 1 | AVX_VNNI = 0 | AVX2 = 1 | AVX512 = 0 | FMA = 1 | "
    assert buildflags.build_features(old) == {"AVX", "AVX2", "FMA"}


def test_missing_features_and_rebuild_command():
    zen5 = buildflags.check_build(PORTABLE_INFO, ZEN5)
    assert zen5.missing == ("AVX_VNNI",) + ALL_AVX512
    assert zen5.unsupported == ()
    checkout, pip = zen5.commands
    assert checkout == "tools/setup.sh --rebuild"
    wanted = f"{buildflags.x86_cmake_args(ZEN5)} {buildflags.RPC_ON}"
    assert pip.startswith(f'CMAKE_ARGS="{wanted}" pip install --force-reinstall')
    assert pip.endswith("--no-cache-dir llama-cpp-python==0.3.36")
    # AMX is never "missing": the recommended build leaves it out on purpose.
    spr = buildflags.check_build(PORTABLE_INFO + "AVX512 = 1 | ", SAPPHIRE_RAPIDS)
    assert "AMX_INT8" not in spr.missing and "AVX512" not in spr.missing and "AVX512_VNNI" in spr.missing

    zen3 = buildflags.check_build(PORTABLE_INFO, ZEN3)
    assert (zen3.missing, zen3.unsupported, zen3.commands) == ((), (), ())
    assert zen3.cpu == {"SSE3", "SSSE3", "AVX", "AVX2", "F16C", "FMA", "BMI2"}

    native_zen5_on_zen3 = buildflags.check_build(PORTABLE_INFO + "AVX512 = 1 | AVX512_VNNI = 1 | ", ZEN3)
    assert native_zen5_on_zen3.unsupported == ("AVX512", "AVX512_VNNI")
    assert native_zen5_on_zen3.commands


def test_doctor_lines_say_when_a_rebuild_pays():
    lines = "\n".join(models_cli._build_lines(buildflags.check_build(PORTABLE_INFO, ZEN5)))
    assert "build uses    SSE3 SSSE3 AVX AVX2 F16C FMA BMI2\n" in lines
    assert "cpu offers    SSE3 SSSE3 AVX AVX_VNNI AVX2 F16C FMA BMI2 AVX512" in lines
    assert "would be faster" in lines and "tools/setup.sh --rebuild" in lines
    assert "-DGGML_AVX512_VNNI=ON" in lines
    ok = "\n".join(models_cli._build_lines(buildflags.check_build(PORTABLE_INFO, ZEN3)))
    assert "not needed" in ok and "setup.sh" not in ok
    bad = "\n".join(models_cli._build_lines(buildflags.check_build(PORTABLE_INFO + "AVX512 = 1 | ", ZEN3)))
    assert "NEEDED" in bad and "AVX512" in bad


def test_script_runs_with_the_stdlib_only():
    # -I -S: no site-packages, so neither llama_cpp nor the package can be imported.
    def run(*args: str) -> str:
        return subprocess.run([sys.executable, "-I", "-S", str(SCRIPT), *args], check=True,
                              capture_output=True, text=True, timeout=60).stdout.strip()

    args = run("--cmake-args")
    assert args == buildflags.recommend().cmake_args
    if "avx2" in buildflags.read_cpu_flags():
        assert "-DGGML_NATIVE=OFF" in args and "-DGGML_AVX2=ON" in args
        assert all(f"-DGGML_AMX_{k}=OFF" in args for k in ("TILE", "INT8", "BF16"))
    assert run("--why") == buildflags.recommend().reason
    assert run(f"--wheel-key={args}") == buildflags.wheel_key(args)


def test_doctor_prints_the_build_check():
    out = subprocess.run([sys.executable, "-m", "sprinter_edge", "doctor", "--no-timing"], check=True,
                         capture_output=True, text=True, timeout=120, cwd=ROOT).stdout
    features = buildflags.build_features(native.system_info()) & set(buildflags.X86_INFO_FEATURES)
    build = buildflags.ordered(features)
    if buildflags.read_cpu_flags():
        assert f"  build uses    {' '.join(build)}\n" in out
        assert "  cpu offers    " in out and "  rebuild       " in out
    assert f'  recommended   CMAKE_ARGS="{buildflags.recommend().cmake_args}"\n' in out


def test_versions_agree():
    setup = (ROOT / "tools" / "setup.sh").read_text()
    assert f'LLAMA_VERSION="{buildflags.LLAMA_CPP_PYTHON_VERSION}"' in setup
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'"llama-cpp-python=={buildflags.LLAMA_CPP_PYTHON_VERSION}"' in pyproject


# A user's CMAKE_ARGS are added to the chosen ones (tools/setup.sh, tools/build_llama_server.sh).
ZEN3_CHOSEN = buildflags.recommend("Linux", "x86_64", ZEN3, nvidia=False).cmake_args


def test_users_cmake_args_are_added_not_put_in_place():
    metal = buildflags.recommend("Darwin", "arm64").cmake_args
    merged = buildflags.merge_cmake_args(metal, "-DGGML_METAL=on")
    # the README's GPU recipe on a Mac: the RPC client stays, nothing of the chosen is replaced
    assert merged.cmake_args == "-DGGML_RPC=ON -DGGML_METAL=on" and merged.replaced == ()
    assert buildflags.has_rpc(merged.cmake_args)

    cuda = buildflags.merge_cmake_args(ZEN3_CHOSEN, "-DGGML_CUDA=on")
    assert cuda.cmake_args == f"{ZEN3_CHOSEN} -DGGML_CUDA=on" and cuda.replaced == ()
    assert options(cuda.cmake_args) == {**options(ZEN3_CHOSEN), "GGML_CUDA": "on"}


def test_the_users_value_wins_for_an_option_both_set():
    merged = buildflags.merge_cmake_args(ZEN3_CHOSEN, "-DGGML_AVX2=OFF -DGGML_NATIVE:BOOL=ON")
    assert merged.replaced == (("GGML_NATIVE", "OFF", "ON"), ("GGML_AVX2", "ON", "OFF"))  # chosen's order
    assert merged.describe_replaced() == ("-DGGML_NATIVE=OFF (yours: -DGGML_NATIVE=ON), "
                                          "-DGGML_AVX2=ON (yours: -DGGML_AVX2=OFF)")
    assert merged.cmake_args.endswith(" -DGGML_AVX2=OFF -DGGML_NATIVE:BOOL=ON")
    assert "-DGGML_AVX2=ON" not in merged.cmake_args and "-DGGML_NATIVE=OFF" not in merged.cmake_args
    assert buildflags.cmake_option(merged.cmake_args, "GGML_AVX2") == "OFF"
    assert buildflags.cmake_option(merged.cmake_args, "GGML_AVX") == "ON"  # a prefix is another option
    assert buildflags.has_rpc(merged.cmake_args)
    # the same value in another case replaces nothing
    assert buildflags.merge_cmake_args(ZEN3_CHOSEN, "-DGGML_RPC=on").replaced == ()


def test_turning_rpc_off_every_way():
    for user in ("-DGGML_RPC=OFF", "-D GGML_RPC=0", "-DGGML_RPC:BOOL=FALSE", "-UGGML_RPC", "-U GGML_RPC"):
        merged = buildflags.merge_cmake_args(ZEN3_CHOSEN, user)
        assert not buildflags.has_rpc(merged.cmake_args), user
        assert [key for key, _, _ in merged.replaced] == ["GGML_RPC"], user
    assert not buildflags.has_rpc("-DGGML_NATIVE=OFF")  # GGML_RPC's default is off
    assert buildflags.has_rpc("-DGGML_RPC=OFF -DGGML_RPC=1")  # the last -D wins, as in cmake


def test_the_users_string_is_kept_verbatim_and_merging_twice_changes_nothing():
    user = ' -DCMAKE_C_FLAGS="-O3 -g"  -G Ninja -DGGML_AVX512=ON '
    merged = buildflags.merge_cmake_args(ZEN3_CHOSEN, user)
    assert merged.cmake_args.endswith(' -DCMAKE_C_FLAGS="-O3 -g"  -G Ninja -DGGML_AVX512=ON')
    assert buildflags.cmake_option(merged.cmake_args, "CMAKE_C_FLAGS") == "-O3 -g"
    # setup.sh exports the merged args and build_llama_server.sh merges again: the same string
    assert buildflags.merge_cmake_args(ZEN3_CHOSEN, merged.cmake_args).cmake_args == merged.cmake_args
    assert buildflags.merge_cmake_args(ZEN3_CHOSEN, "  ").cmake_args == ZEN3_CHOSEN
    # the wheel key follows the merged args
    assert buildflags.wheel_key(merged.cmake_args) != buildflags.wheel_key(ZEN3_CHOSEN)


def test_merge_from_the_command_line_with_the_stdlib_only():
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-I", "-S", str(SCRIPT), *args], capture_output=True,
                              text=True, timeout=60)

    chosen = buildflags.recommend().cmake_args
    out = run("--cmake-args", "--user=-DGGML_METAL=on").stdout.strip()
    assert out == buildflags.merge_cmake_args(chosen, "-DGGML_METAL=on").cmake_args
    assert buildflags.has_rpc(out) and out.endswith("-DGGML_METAL=on")
    assert run("--cmake-args", "--user=").stdout.strip() == chosen
    replaced = run("--replaced", "--user=-DGGML_RPC=OFF").stdout.strip()
    assert replaced == "-DGGML_RPC=ON (yours: -DGGML_RPC=OFF)"
    assert run("--replaced", "--user=-DGGML_METAL=on").stdout.strip() == ""
    bad = run("--cmake-args", '--user=-DX="a')
    assert bad.returncode == 2 and bad.stderr.startswith("buildflags: error: CMAKE_ARGS=")

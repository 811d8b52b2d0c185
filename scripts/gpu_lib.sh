# Shared by the GPU scripts (gpu_check.sh, gpu_profile.sh, gpu_logits_compare.sh).

# use_deps: the Debian packages the CPU side needs (json, spdlog, Catch2,
# OpenBLAS, PCRE2, pkg-config) from the system when present; otherwise the
# .deb files of .deps/ (made on a Debian machine by scripts/gpu_deps.sh and
# carried to the GPU machine) unpacked into /tmp/attnres-deps, with the
# environment to build against them and to run what was built (OpenBLAS's
# own libgfortran is found only through LD_LIBRARY_PATH, not the binary's
# RUNPATH). Sets deps_cmake_args for CMake's configure; returns 1 with a
# message when neither is there.
use_deps() {
  deps_cmake_args=()
  local h have=1
  for h in nlohmann/json.hpp catch2/catch.hpp spdlog/spdlog.h pcre2.h x86_64-linux-gnu/cblas.h; do
    [[ -f /usr/include/$h ]] || have=0
  done
  command -v pkg-config >/dev/null || have=0
  [[ $have -eq 1 ]] && return 0
  if ! ls .deps/*.deb >/dev/null 2>&1; then
    echo "error: the CPU-side dependencies are missing and .deps/ holds no .deb files" >&2
    echo "       (run scripts/gpu_deps.sh on a Debian machine and carry .deps/)" >&2
    return 1
  fi
  local prefix=/tmp/attnres-deps f
  mkdir -p "$prefix"
  for f in .deps/*.deb; do dpkg-deb -x "$f" "$prefix"; done
  local lib="$prefix/usr/lib/x86_64-linux-gnu"
  export CMAKE_PREFIX_PATH="$prefix/usr"
  export LD_LIBRARY_PATH="$lib:$lib/openblas-openmp:${LD_LIBRARY_PATH:-}"
  # PCRE2 is found through pkg-config: the unpacked pkgconf, reading only the
  # unpacked .pc files, with their /usr paths moved under the prefix.
  export PKG_CONFIG_LIBDIR="$lib/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$prefix"
  deps_cmake_args=("-DATTNRES_BLAS_INCLUDE_DIR=$prefix/usr/include/x86_64-linux-gnu/openblas-openmp"
                   "-DATTNRES_BLAS_LIBRARY=$lib/openblas-openmp/libopenblas.so"
                   "-DPKG_CONFIG_EXECUTABLE=$prefix/usr/bin/pkgconf")
}

# pack_to_out NAME DIR: when $OUT is set (the device tool's folder, which
# returns at most 8 files), DIR's contents as $OUT/NAME.tgz, written whole and
# then renamed, so a command stopped mid-way still leaves the last complete
# archive. Unpacking every archive of a session into one folder gives
# scripts/gpu_report.py its input.
pack_to_out() {
  [[ -n "${OUT:-}" ]] || return 0
  tar czf "$OUT/$1.tgz.part" -C "$2" . && mv "$OUT/$1.tgz.part" "$OUT/$1.tgz"
}

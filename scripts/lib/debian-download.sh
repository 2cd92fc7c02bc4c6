# Downloads Debian packages without touching the system; sourced by the scripts that need a
# vendor's library (fetch-vendor-runtimes) or a reference tool (json-floor).
#
#   debian_download VENDOR_DIR PACKAGE...
#
# apt reads a private sources list and lists folder under VENDOR_DIR, `apt-get download` puts
# the .deb files in VENDOR_DIR/debs (a package already there is not fetched again), and nothing
# is installed: the caller unpacks them with `dpkg -x`. Returns 1, having said why on stderr
# and in VENDOR_DIR/apt-*.log, where the registry cannot be reached; a package that cannot
# be downloaded is named on stderr and skipped.
debian_download() {
  local vendor=$1
  shift
  mkdir -p "$vendor/debs" "$vendor/lists/partial" "$vendor/cache/archives/partial"
  local codename
  codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
  codename=${codename:-bookworm}
  cat >"$vendor/sources.list" <<SRC
deb http://deb.debian.org/debian $codename main contrib non-free non-free-firmware
deb http://deb.debian.org/debian $codename-updates main contrib non-free non-free-firmware
SRC
  local apt_opts=(
    -o "Dir::Etc::SourceList=$vendor/sources.list"
    -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::State::Lists=$vendor/lists"
    -o "Dir::Cache=$vendor/cache"
    -o "APT::Sandbox::User=root"
    -o "Debug::NoLocking=1"
  )
  local missing=() p
  for p in "$@"; do
    ls "$vendor/debs/${p}"_*.deb >/dev/null 2>&1 || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if ! apt-get "${apt_opts[@]}" -qq update >"$vendor/apt-update.log" 2>&1; then
    echo "apt-get update failed (no registry?); see $vendor/apt-update.log" >&2
    return 1
  fi
  (
    cd "$vendor/debs" || exit 1
    for p in "${missing[@]}"; do
      apt-get "${apt_opts[@]}" -qq download "$p" >>"$vendor/apt-download.log" 2>&1 ||
        echo "could not download $p (see $vendor/apt-download.log)" >&2
    done
  )
}

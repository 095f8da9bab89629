# Sourced by scripts/callgrind-http.sh, callgrind-layer.sh and
# callgrind-memory.sh: the helpers they share.

# The cases of benches/http_instructions.rs, variant:load, both scripts
# that run it measure by default.
http_cases="bare:admitted memory:admitted memory:rejected memory-no-headers:admitted governor:admitted governor:rejected governor-headers:admitted"

# callgrind_setup BENCH: exits unless valgrind is installed; builds
# benches/BENCH.rs (release, as `cargo bench` does) into $bin, and makes a
# temporary directory, $work, removed when the script exits.
callgrind_setup() {
  local me
  me="$(basename "$0")"
  command -v valgrind >/dev/null || { echo "$me: needs valgrind (apt-get install -y valgrind)" >&2; exit 1; }
  bin="$(cargo bench --bench "$1" --no-run --message-format=json 2>/dev/null \
    | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)"
  [ -x "$bin" ] || { echo "$me: could not build benches/$1.rs" >&2; exit 1; }
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
}

# calibration OUT: the inclusive instructions, in the callgrind profile
# OUT, of the clock's one-off calibration (quanta's, behind once_cell's
# generic initialiser), which runs for a set time and so for a varying
# number of instructions (10M to 18M seen). Nothing when the profile has
# none.
calibration() {
  callgrind_annotate --inclusive=yes --threshold=100 "$1" 2>/dev/null \
    | sed -n 's/^ *\([0-9,]*\) .*once_cell::imp::initialize_or_wait .*/\1/p' | head -1 | tr -d ,
}

# without_calibration TOTAL OUT CLOCKLESS: TOTAL, the instructions of the
# run profiled in OUT, less the clock's calibration, which would move the
# scripts' figures by up to 1000. Should quanta stop using once_cell, says
# so rather than count the calibration in silently, unless CLOCKLESS is 1
# (a run that reads no clock, such as bare axum's).
without_calibration() {
  local once
  once="$(calibration "$2")"
  [ -n "$once" ] || [ "$3" = 1 ] || echo "$(basename "$0"): no clock calibration (once_cell::imp::initialize_or_wait) in the profile; this figure includes it" >&2
  echo $(( $1 - ${once:-0} ))
}

# Sourced by scripts/callgrind-http.sh, callgrind-layer.sh and callgrind-memory.sh:
# the helpers they share.
#
# calibration OUT: the inclusive instructions, in the callgrind profile
# OUT, of the clock's one-off calibration (quanta's, behind once_cell's
# generic initialiser), which runs for a set time and so for a varying
# number of instructions (10M to 18M seen): the scripts leave it out of
# their figures. Prints nothing when the profile has none; should quanta
# stop using once_cell, the callers say so rather than count it silently.
calibration() {
  callgrind_annotate --inclusive=yes --threshold=100 "$1" 2>/dev/null \
    | sed -n 's/^ *\([0-9,]*\) .*once_cell::imp::initialize_or_wait .*/\1/p' | head -1 | tr -d ,
}

# bench_executable NAME: builds benches/NAME.rs (release, as `cargo bench`
# does) and prints its executable's path; nothing if it did not build.
bench_executable() {
  cargo bench --bench "$1" --no-run --message-format=json 2>/dev/null \
    | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1
}

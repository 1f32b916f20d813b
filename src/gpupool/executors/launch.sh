#!/bin/sh
# The launcher every attempt runs under: sh launch.sh ATTEMPT_DIR COMMAND...
#
# It records its pid and start time (launcher.json), starts the command, stays alive through
# the notice's SIGTERM (a trap, not an ignore, so the command keeps the default action), waits
# for the command and writes its exit status to exit.json: an attempt's outcome survives a crash
# of the scheduler. A POSIX shell, not Python, so that starting an attempt costs milliseconds.
dir=$1
shift
started=$(sed 's/.*) //' "/proc/$$/stat" | cut -d' ' -f20)
printf '{"pid": %s, "started": "%s"}' "$$" "$started" > "$dir/launcher.json.tmp"
mv "$dir/launcher.json.tmp" "$dir/launcher.json"
trap ':' TERM
"$@" &
child=$!
while :; do
    wait "$child"
    code=$?
    kill -0 "$child" 2>/dev/null || break
done
printf '{"exit_code": %s}' "$code" > "$dir/exit.json.tmp"
mv "$dir/exit.json.tmp" "$dir/exit.json"
exit "$code"

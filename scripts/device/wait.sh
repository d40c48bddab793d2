#!/usr/bin/env bash
# Wait up to $1 seconds for /tmp/res/$2 (a pipeline's flag file), then pack /tmp/res
# (results, logs, traces so far) into $OUT/res.tgz.
secs=${1:?seconds}; flag=${2:?flag}
for _ in $(seq "$secs"); do
  [ -e "/tmp/res/$flag" ] && break
  sleep 1
done
ls /tmp/res; tail -n 15 /tmp/res/*.log
tar -czf "$OUT/res.tgz" -C /tmp res

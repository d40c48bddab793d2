#!/usr/bin/env bash
# Several pipelines on one lease, one after the other: SEQ="hope.sh pipeline.sh". Each one's
# DONE flag becomes <name>_DONE (e.g. hope_DONE) before the next starts; DONE after the last.
set -u
for p in ${SEQ:?SEQ names the pipelines}; do
  bash "/tmp/code/$p" >> "/tmp/res/${p%.sh}.pipeline.log" 2>&1
  mv /tmp/res/DONE "/tmp/res/${p%.sh}_DONE" 2>/dev/null || touch "/tmp/res/${p%.sh}_FAILED"
done
touch /tmp/res/DONE

#!/bin/sh
# A stand-in rank for launcher tests: rank 1 fails as asked, the others would
# run for a minute unless the launcher stops them.
# Usage: rank_fails.sh exit|kill
rank="${RANK:-$OMPI_COMM_WORLD_RANK}"
if [ "$rank" = 1 ]; then
  case "$1" in
    exit) exit 3 ;;
    kill) kill -9 $$ ;;
  esac
fi
sleep 60

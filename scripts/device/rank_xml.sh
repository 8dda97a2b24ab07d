#!/bin/sh
# dtrain launch -n N -- sh scripts/device/rank_xml.sh PREFIX PROGRAM [ARGS...]
# runs PROGRAM once per rank with its gtest XML report in PREFIX-rankR.xml
# (R: the rank launch gives it), so the ranks do not write the same file.
prefix=$1
shift
exec "$@" --gtest_output="xml:${prefix}-rank${RANK:-0}.xml"

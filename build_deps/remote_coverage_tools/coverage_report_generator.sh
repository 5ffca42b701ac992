#!/bin/sh
echo "coverage reports are not available in tfcomp's offline Bazel build" >&2
exit 1

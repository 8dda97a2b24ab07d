# Debian packages dtrain needs: the one list, sourced by scripts/setup (which
# installs them all) and scripts/device/make_kit.sh (which carries the
# libraries to a GPU machine). A new dependency goes in here and reaches both.
#
# Libraries dtrain's build compiles and links against. make_kit.sh unpacks each
# with the runtime libraries it depends on.
DTRAIN_LIBRARY_PACKAGES=(
  libopenmpi-dev
  libcli11-dev nlohmann-json3-dev libxxhash-dev zlib1g-dev libsentencepiece-dev
  libgtest-dev libgmock-dev
  libgloo-dev
)
# Tools for building and running here (a GPU machine brings its own compiler,
# CMake and Python).
DTRAIN_TOOL_PACKAGES=(build-essential cmake ninja-build pkg-config python3 python3-venv ccache openmpi-bin)
# Data sets and plotting for the tests, the demo and the benchmarks.
DTRAIN_DATA_PACKAGES=(dataset-fashion-mnist fortunes gnuplot-nox)

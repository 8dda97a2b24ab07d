// The shipped dtrain: the command line (dtrain/cli.h) with the built-in models.
#include "dtrain/cli.h"

int main(int argc, char** argv) { return dtrain::cli::main(argc, argv); }

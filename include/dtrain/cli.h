// The whole dtrain command line as a function, for a program of one's own:
// register its models, then hand over argc and argv, and the program is a
// dtrain whose train and plan take --model yours with every flag.
// `train --nproc N` and `launch` start the ranks as copies of this same
// program (/proc/self/exe), so they register the same models.
//
//   int main(int argc, char** argv) {
//     dtrain::register_model("mynet", my_spec());   // dtrain/model_spec.h
//     return dtrain::cli::main(argc, argv);
//   }
//
// Link dtrain::cli (find_package(dtrain)). The shipped dtrain is this with
// the built-in models alone.
#pragma once

namespace dtrain::cli {

// Parses argv as dtrain does and runs the subcommand; returns the exit
// status (0, 1 for an error, 2 for a usage error).
int main(int argc, char** argv);

}  // namespace dtrain::cli

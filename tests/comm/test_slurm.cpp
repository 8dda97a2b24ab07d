// Starting under srun (src/comm/slurm.h): Slurm's host list syntax, and the
// torchrun variables derived from a Slurm step's, from a fake environment.
#include "comm/slurm.h"

#include "dtrain/comm.h"

#include <gtest/gtest.h>

#include <map>

namespace {

using Hosts = std::vector<std::string>;
using Vars = std::vector<std::pair<std::string, std::string>>;

dtrain::EnvLookup fake(std::map<std::string, std::string> values) {
  return [values](const char* name) -> std::optional<std::string> {
    const auto it = values.find(name);
    if (it == values.end() || it->second.empty()) return std::nullopt;
    return it->second;
  };
}

// What srun gives task 3 of 4 on the second of two nodes.
std::map<std::string, std::string> srun_task() {
  return {{"SLURM_STEP_ID", "0"},  {"SLURM_PROCID", "3"},
          {"SLURM_NTASKS", "4"},   {"SLURM_LOCALID", "1"},
          {"SLURM_JOB_ID", "123456"}, {"SLURM_NODELIST", "gpu[07-08]"},
          {"SLURM_STEP_NODELIST", "gpu[07-08]"}};
}

TEST(SlurmHostlist, PlainNamesAndRanges) {
  EXPECT_EQ(dtrain::expand_slurm_hostlist("localhost"), Hosts{"localhost"});
  EXPECT_EQ(dtrain::expand_slurm_hostlist("node[01-03,07],gpu5"), (Hosts{"node01", "node02", "node03", "node07", "gpu5"}));
  EXPECT_EQ(dtrain::expand_slurm_hostlist("a,b[1],c"), (Hosts{"a", "b1", "c"}));
  // Padding follows the first bound, and a range may cross a power of ten.
  EXPECT_EQ(dtrain::expand_slurm_hostlist("n[08-10]"), (Hosts{"n08", "n09", "n10"}));
  EXPECT_EQ(dtrain::expand_slurm_hostlist("n[9-10]"), (Hosts{"n9", "n10"}));
  // A suffix after the brackets, and several groups (the first varies slowest).
  EXPECT_EQ(dtrain::expand_slurm_hostlist("r[1-2]-n[3,5].ib"), (Hosts{"r1-n3.ib", "r1-n5.ib", "r2-n3.ib", "r2-n5.ib"}));
}

TEST(SlurmHostlist, MalformedListsAreErrors) {
  for (const char* bad : {"", "a,,b", "node[1-3", "node1-3]", "node[3-1]", "node[a-b]", "node[]", "node[[1]]",
                          "node[1-100000000]"})
    EXPECT_THROW(dtrain::expand_slurm_hostlist(bad), dtrain::CommError) << bad;
}

TEST(SlurmEnvironment, AStepBecomesTorchrunVariables) {
  EXPECT_TRUE(dtrain::in_slurm_step(fake(srun_task())));
  const Vars expected{{"RANK", "3"},
                      {"WORLD_SIZE", "4"},
                      {"LOCAL_RANK", "1"},
                      {"MASTER_ADDR", "gpu07"},
                      {"MASTER_PORT", std::to_string(15000 + 123456 % 15000)}};
  EXPECT_EQ(dtrain::c10d_variables_from_slurm(fake(srun_task())), expected);
}

TEST(SlurmEnvironment, TheStepNodeListWinsAndSetVariablesAreKept) {
  auto task = srun_task();
  task["SLURM_NODELIST"] = "login,gpu[07-08]";  // the job's; the step runs on gpu[07-08]
  task["MASTER_PORT"] = "29999";
  task["LOCAL_RANK"] = "5";
  const Vars expected{{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "gpu07"}};
  EXPECT_EQ(dtrain::c10d_variables_from_slurm(fake(task)), expected);
  task.erase("SLURM_STEP_NODELIST");
  EXPECT_EQ(dtrain::c10d_variables_from_slurm(fake(task))[2].second, "login");
}

TEST(SlurmEnvironment, NotAStep) {
  // An sbatch script has SLURM_PROCID=0 and the job's SLURM_NTASKS, but no step.
  auto batch = srun_task();
  batch.erase("SLURM_STEP_ID");
  EXPECT_FALSE(dtrain::in_slurm_step(fake(batch)));
  EXPECT_TRUE(dtrain::c10d_variables_from_slurm(fake(batch)).empty());
  EXPECT_TRUE(dtrain::c10d_variables_from_slurm(fake({})).empty());
  // torchrun inside srun already set the job's ranks: nothing to derive.
  auto torchrun = srun_task();
  torchrun["RANK"] = "0";
  torchrun["WORLD_SIZE"] = "8";
  EXPECT_TRUE(dtrain::c10d_variables_from_slurm(fake(torchrun)).empty());
}

TEST(SlurmEnvironment, BadValuesNameTheVariable) {
  auto task = srun_task();
  task["SLURM_PROCID"] = "4";  // not below SLURM_NTASKS
  try {
    dtrain::c10d_variables_from_slurm(fake(task));
    FAIL() << "no error";
  } catch (const dtrain::CommError& error) {
    EXPECT_NE(std::string(error.what()).find("SLURM_PROCID='4'"), std::string::npos) << error.what();
  }
  task = srun_task();
  task["SLURM_JOB_ID"] = "12x";
  EXPECT_THROW(dtrain::c10d_variables_from_slurm(fake(task)), dtrain::CommError);
  task = srun_task();
  task.erase("SLURM_NODELIST");
  task.erase("SLURM_STEP_NODELIST");
  EXPECT_THROW(dtrain::c10d_variables_from_slurm(fake(task)), dtrain::CommError);
}

}  // namespace

// Sums each rank's number with the installed dtrain; prints the world size and sum.
#include <dtrain/comm.h>

#include <iostream>

int main(int argc, char** argv) {
  auto world = dtrain::init(argc, argv);
  auto value = torch::full({1}, world->rank() + 1.0);
  world->all_reduce(value)->wait();
  if (world->rank() == 0) std::cout << "consumer: world " << world->size() << " sum " << value.item<double>() << "\n";
  return 0;
}

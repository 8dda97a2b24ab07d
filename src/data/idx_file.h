// Internal: the IDX file format of (Fashion-)MNIST, optionally gzipped.
//
// An IDX file is a header -- magic number 0x0000TTNN (TT = element type,
// NN = number of dimensions), then NN big-endian uint32 dimension sizes --
// followed by exactly the product of the sizes in elements, row-major.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::data {

// Reads an IDX file of unsigned bytes (type 0x08) through zlib, which reads
// gzipped and plain files alike. expected_dims gives the dimensions the
// caller can accept, -1 meaning any size; `what` names the elements in
// messages ("pixels", "labels"). Returns a uint8 tensor shaped as the
// header says. Throws std::runtime_error, starting with the path, for a
// file that cannot be read, a wrong magic number or dimensions, a body
// shorter or longer than the header promises, or corrupt gzip data.
torch::Tensor read_idx_ubyte(const std::string& path, const std::vector<int64_t>& expected_dims,
                             const std::string& what);

}  // namespace dtrain::data

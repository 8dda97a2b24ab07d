// The translation unit that builds dtrain's precompiled header
// (cmake/DtrainPrecompiledHeaders.cmake); it has no code of its own.

# `cmake --install` lays out headers, the library, the CLI and a package
# config, so another project can `find_package(dtrain)` and link dtrain::dtrain
# (and dtrain::cli, the command line for a program's own models: dtrain/cli.h).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS dtrain dtrain_torch dtrain_cli_lib EXPORT dtrainTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS dtrain_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/dtrain DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT dtrainTargets NAMESPACE dtrain:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dtrain)

configure_package_config_file(cmake/dtrainConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/dtrainConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dtrain)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/dtrainConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/dtrainConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/dtrainConfigVersion.cmake
              cmake/dtrainTorchArch.cmake cmake/dtrainTorchCpuOnly.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dtrain)

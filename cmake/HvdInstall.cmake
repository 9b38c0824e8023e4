# What `cmake --install` (and a wheel) delivers besides the programs: the two shared libraries
# users link, the public headers, a pkg-config file per library and a CMake package config.
#   libhvd_bridge.so   the launch plane: driver service, job launch, task service
#                      (include/hvd/driver.h, launch.h, task.h, rpc.h, net.h, proto.h)
#   libhvd_runtime.so  the collective runtime (include/hvd/runtime.h, entry.h) and the rank
#                      side of elastic jobs (include/hvd/elastic.h)
# They are the static parts linked whole; the programs and the extensions keep linking the
# static parts (nothing to find at run time but system libraries).

file(WRITE ${CMAKE_BINARY_DIR}/hvd_empty.c "/* a shared library made of static parts */\n")

function(hvd_shared_from name output)
  add_library(${name} SHARED ${CMAKE_BINARY_DIR}/hvd_empty.c)
  set_target_properties(${name} PROPERTIES OUTPUT_NAME ${output} VERSION ${PROJECT_VERSION}
                        SOVERSION ${PROJECT_VERSION_MAJOR}
                        LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/lib)
  target_link_libraries(${name} PRIVATE -Wl,--whole-archive ${ARGN} -Wl,--no-whole-archive)
  if(NOT HVD_SANITIZE) # a sanitized library leaves the sanitizer runtime to the executable
    target_link_options(${name} PRIVATE -Wl,--no-undefined)
  endif()
  install(TARGETS ${name} LIBRARY DESTINATION ${HVD_INSTALL_LIBDIR})
endfunction()

hvd_shared_from(hvd_bridge_shared hvd_bridge hvd_task hvd_launch hvd_driver hvd_rpc hvd_common)
target_link_libraries(hvd_bridge_shared PUBLIC PkgConfig::MSGPACK OpenSSL::Crypto Threads::Threads)
if(TARGET hvd_runtime)
  find_package(MPI REQUIRED COMPONENTS C)
  hvd_shared_from(hvd_runtime_shared hvd_runtime hvd_runtime hvd_elastic)
  target_link_libraries(hvd_runtime_shared PUBLIC hvd_common MPI::MPI_C Threads::Threads m
                                                  ${CMAKE_DL_LIBS}
                                           PRIVATE hvd_rpc)
endif()

install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/hvd DESTINATION ${HVD_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")

if(NOT SKBUILD)
  set(_pc_libdir "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
  set(_pc_incdir "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
  foreach(pc hvd-bridge hvd-runtime)
    configure_file(${CMAKE_SOURCE_DIR}/cmake/${pc}.pc.in ${CMAKE_BINARY_DIR}/${pc}.pc @ONLY)
    install(FILES ${CMAKE_BINARY_DIR}/${pc}.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
  endforeach()
  include(CMakePackageConfigHelpers)
  configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/hvd-bridgeConfig.cmake.in
                                ${CMAKE_BINARY_DIR}/hvd-bridgeConfig.cmake
                                INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/hvd-bridge
                                PATH_VARS CMAKE_INSTALL_INCLUDEDIR CMAKE_INSTALL_LIBDIR)
  write_basic_package_version_file(${CMAKE_BINARY_DIR}/hvd-bridgeConfigVersion.cmake
                                   COMPATIBILITY SameMajorVersion)
  install(FILES ${CMAKE_BINARY_DIR}/hvd-bridgeConfig.cmake
                ${CMAKE_BINARY_DIR}/hvd-bridgeConfigVersion.cmake
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/hvd-bridge)
endif()

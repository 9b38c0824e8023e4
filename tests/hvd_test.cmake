# hvd_add_test(NAME name SOURCES a.c b.c LIBS lib... [TIMEOUT s] [LABELS l...])
# Builds one test program and registers it with ctest. Exit code 77 means "skipped".
function(hvd_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS;ARGS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} hvd_testutil)
  add_test(NAME ${T_NAME} COMMAND ${T_NAME} ${T_ARGS})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT} SKIP_RETURN_CODE 77
                       LABELS "${T_LABELS}")
endfunction()

add_library(hvd_testutil STATIC ${CMAKE_CURRENT_LIST_DIR}/testutil/testutil.c)
target_include_directories(hvd_testutil PUBLIC ${CMAKE_CURRENT_LIST_DIR}/testutil)
target_link_libraries(hvd_testutil PUBLIC Threads::Threads)

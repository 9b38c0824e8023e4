# Task service benchmarks (included by bench/services/CMakeLists.txt).
# task_idle_rss: resident memory of an idle hvd-task against a driver (target < 5 MiB).
#   Run: bench/services/task_idle_rss bin/hvd-task
if(TARGET hvd_driver AND TARGET hvd-task)
  add_executable(task_idle_rss ${CMAKE_CURRENT_LIST_DIR}/task_idle_rss.c)
  target_link_libraries(task_idle_rss PRIVATE hvd_driver hvd_rpc)
  add_dependencies(task_idle_rss hvd-task)
endif()

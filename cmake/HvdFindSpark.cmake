# Where Spark's jars are, for compiling the Java code that uses Spark's API (org.hvdbridge.spark
# in hvd-bridge.jar, the example application in examples/spark). Spark is a provided
# dependency: compiled against, never bundled.
#
#   hvd_find_spark(<var>)
#
# sets <var> to a Spark home whose jars/ holds spark-core_*.jar: $SPARK_HOME when it has
# them, else the directory of the pyspark package that a python3 on this machine imports
# (scripts/install-spark.sh installs it); "" when neither has them. Looked up again at every
# configure, so installing Spark and re-running cmake picks it up.
function(hvd_find_spark var)
  set(_home "$ENV{SPARK_HOME}")
  if(NOT _home OR NOT EXISTS "${_home}/jars")
    set(_home "")
    find_package(Python3 COMPONENTS Interpreter QUIET)
    if(Python3_FOUND)
      execute_process(
        COMMAND ${Python3_EXECUTABLE} -c
                "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('pyspark').origin))"
        OUTPUT_VARIABLE _home OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    endif()
  endif()
  set(_core "")
  if(_home)
    file(GLOB _core "${_home}/jars/spark-core_*.jar")
  endif()
  if(NOT _core)
    set(_home "")
  endif()
  set(${var} "${_home}" PARENT_SCOPE)
endfunction()

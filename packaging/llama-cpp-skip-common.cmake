# Included by CMake right after llama.cpp's project() (CMAKE_PROJECT_llama.cpp_INCLUDE, set in the Makefile).
# llama-cpp-python forces LLAMA_BUILD_COMMON on, but its Python package loads only libllama and libggml: the
# `common` library (argument parsing, chat templates, JSON) serves llama.cpp's own tools, so it is not compiled.
set(LLAMA_BUILD_COMMON OFF CACHE BOOL "llama: build common utils library" FORCE)

// The Catch2 main of every test executable (compiled once, in wb_test_support).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

this is not C++: the environment must build with its own binding.cpp

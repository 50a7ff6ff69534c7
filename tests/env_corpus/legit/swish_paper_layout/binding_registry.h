#error "the environment must supply binding_registry.h"

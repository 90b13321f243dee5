# The installed SDK: a CMake package (find_package(rlx) gives rlx::rlx and rlx::headers) and a
# pkg-config file (rlx.pc, with the plugin folder as variable `plugindir`). Both are
# relocatable: they find the prefix from their own location, as librlx finds its plugins.
# Included from the top-level CMakeLists.txt after add_subdirectory(core).
include(CMakePackageConfigHelpers)

function(rlx__install_package)
  set(here ${CMAKE_CURRENT_FUNCTION_LIST_DIR})
  set(out ${CMAKE_BINARY_DIR}/share/package)
  set(RLX_CMAKE_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/rlx)
  set(RLX_PLUGIN_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/rlx/plugins)
  file(STRINGS ${PROJECT_SOURCE_DIR}/core/include/rlx/plugin.h abi_line REGEX "^#define RLX_ABI_MAJOR [0-9]+")
  string(REGEX REPLACE ".* ([0-9]+)$" "\\1" RLX_ABI_MAJOR "${abi_line}")

  install(EXPORT rlxTargets NAMESPACE rlx:: FILE rlxTargets.cmake DESTINATION ${RLX_CMAKE_INSTALL_DIR})
  configure_package_config_file(${here}/rlxConfig.cmake.in ${out}/rlxConfig.cmake
    INSTALL_DESTINATION ${RLX_CMAKE_INSTALL_DIR}
    PATH_VARS CMAKE_INSTALL_INCLUDEDIR RLX_PLUGIN_INSTALL_DIR)
  # Before 1.0 a minor release may change the API; from 1.0 on, only a major does.
  if(PROJECT_VERSION_MAJOR EQUAL 0)
    set(compat SameMinorVersion)
  else()
    set(compat SameMajorVersion)
  endif()
  write_basic_package_version_file(${out}/rlxConfigVersion.cmake VERSION ${PROJECT_VERSION} COMPATIBILITY ${compat})
  install(FILES ${out}/rlxConfig.cmake ${out}/rlxConfigVersion.cmake DESTINATION ${RLX_CMAKE_INSTALL_DIR})

  # rlx.pc: the prefix relative to ${pcfiledir}, unless the install dirs are absolute.
  if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
    set(RLX_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  else()
    file(RELATIVE_PATH up /root/${CMAKE_INSTALL_LIBDIR}/pkgconfig /root)
    string(REGEX REPLACE "/$" "" up "${up}")
    set(RLX_PC_PREFIX "\${pcfiledir}/${up}")
  endif()
  foreach(kind LIBDIR INCLUDEDIR)
    if(IS_ABSOLUTE "${CMAKE_INSTALL_${kind}}")
      set(RLX_PC_${kind} "${CMAKE_INSTALL_${kind}}")
    else()
      set(RLX_PC_${kind} "\${prefix}/${CMAKE_INSTALL_${kind}}")
    endif()
  endforeach()
  configure_file(${here}/../pkgconfig/rlx.pc.in ${out}/rlx.pc @ONLY)
  install(FILES ${out}/rlx.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endfunction()

rlx__install_package()

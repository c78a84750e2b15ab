# cubist_public_headers(<out-var> <folder>...): the headers (*.h) of the given source
# folders that the installed package offers, as paths relative to the source root.
#
# The rule, instead of a hand-kept list: a header is private when it includes a
# dependency the library keeps to itself - <curl/...> (libcurl is dlopened; its header
# is a build dependency only) or <nlohmann/...> (JSON is the library's business) - or
# when it includes another private header of the project. Everything else is public.
function(cubist_public_headers out)
  set(_all)
  foreach(_dir ${ARGN})
    file(GLOB _found RELATIVE ${PROJECT_SOURCE_DIR} CONFIGURE_DEPENDS
         ${PROJECT_SOURCE_DIR}/${_dir}/*.h)
    list(APPEND _all ${_found})
  endforeach()
  set(_private)
  foreach(_h ${_all})
    file(STRINGS ${PROJECT_SOURCE_DIR}/${_h} _hits REGEX "^#include <(curl|nlohmann)/")
    if(_hits)
      list(APPEND _private ${_h})
    endif()
  endforeach()
  # Whatever includes a private header is private too, until nothing changes.
  set(_changed TRUE)
  while(_changed)
    set(_changed FALSE)
    foreach(_h ${_all})
      if(_h IN_LIST _private)
        continue()
      endif()
      file(STRINGS ${PROJECT_SOURCE_DIR}/${_h} _includes REGEX "^#include \"")
      foreach(_line ${_includes})
        string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" _included "${_line}")
        if(_included IN_LIST _private)
          list(APPEND _private ${_h})
          set(_changed TRUE)
          break()
        endif()
      endforeach()
    endforeach()
  endwhile()
  set(_public ${_all})
  if(_private)
    list(REMOVE_ITEM _public ${_private})
  endif()
  set(${out} ${_public} PARENT_SCOPE)
endfunction()

# Runs one command line that must succeed, then checks the files it wrote:
# JSON parses (python3 json), SVG is well-formed XML with an <svg> root and
# renders with rsvg-convert into a PNG whose signature and size are checked.
#   cmake -DEXE=prog "-DARGS=arg;arg" [-DJSON=file] [-DSVG=file;file] -P check_outputs.cmake
# Missing tools are errors: scripts/setup.sh installs them (librsvg2-bin).
execute_process(COMMAND ${EXE} ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("$ ${EXE} ${ARGS}\n${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "exit status ${rc}, expected 0")
endif()
find_program(PYTHON3 python3 REQUIRED)
foreach(f IN LISTS JSON)
  execute_process(COMMAND ${PYTHON3} -c
    "import json,sys; d=json.load(open(sys.argv[1])); assert d, 'empty JSON'; print(type(d).__name__, len(d))"
    ${f} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${f} is not valid JSON:\n${err}")
  endif()
  message("${f}: JSON ${out}")
endforeach()
# Without rsvg-convert (scripts/setup.sh installs it; a bare GPU machine may
# lack it) the SVGs are still parsed, and the test reports itself skipped
# (SKIP_REGULAR_EXPRESSION in CMakeLists.txt) instead of passing.
find_program(RSVG rsvg-convert)
foreach(f IN LISTS SVG)
  execute_process(COMMAND ${PYTHON3} -c
    "import sys, xml.etree.ElementTree as E; r=E.parse(sys.argv[1]).getroot(); assert r.tag.endswith('svg'), r.tag; assert len(r.findall('.//{http://www.w3.org/2000/svg}text')) > 3, 'no text'"
    ${f} RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${f} is not a well-formed SVG:\n${err}")
  endif()
  if(NOT RSVG)
    message("SKIPPED: rsvg-convert not found (Debian librsvg2-bin; scripts/setup.sh): "
            "${f} parsed but not rendered")
    continue()
  endif()
  execute_process(COMMAND ${RSVG} ${f} -o ${f}.png RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "rsvg-convert ${f} failed:\n${err}")
  endif()
  execute_process(COMMAND ${PYTHON3} -c
    "import struct,sys; b=open(sys.argv[1],'rb').read(); assert b[:8]==b'\\x89PNG\\r\\n\\x1a\\n', 'not a PNG'; w,h=struct.unpack('>II', b[16:24]); assert b[12:16]==b'IHDR' and w>=300 and h>=100, (w,h); assert b[-8:-4]==b'IEND', 'truncated'; print(w, 'x', h, len(b), 'bytes')"
    ${f}.png RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${f}.png is not a well-formed PNG:\n${err}")
  endif()
  message("${f}.png: ${out}")
endforeach()

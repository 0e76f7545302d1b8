# Writes OUT, a C file holding the bytes of IN as bloomgrid_descriptor_set[]
# and its length (see proto/proto_descriptors.h).
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
math(EXPR len "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "((0x..,){16})" "\\1\n" body "${body}")
file(WRITE "${OUT}" "#include <stddef.h>\n"
  "const unsigned char bloomgrid_descriptor_set[] = {\n${body}\n};\n"
  "const size_t bloomgrid_descriptor_set_len = ${len};\n")

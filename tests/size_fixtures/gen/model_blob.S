    .section .rodata.model,"a",%progbits
    .balign 64
    .globl colibri_blob_data
    .hidden colibri_blob_data
    .type colibri_blob_data, %object
colibri_blob_data:
    .incbin "model.bin"
    .size colibri_blob_data, . - colibri_blob_data
#if defined(__ELF__)
    .section .note.GNU-stack,"",%progbits
#endif

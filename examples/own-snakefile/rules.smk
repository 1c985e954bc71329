rule included_rule:
    input: "out/{lang}/clean.txt"
    output: "out/{lang}/included.txt"
    shell: "cat {input} > {output}"

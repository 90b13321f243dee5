// A chat template rendered by Hugging Face's @huggingface/jinja, as transformers.js's
// apply_chat_template renders it: reads {"npm": DIR, "template": T, "vars": {...}} as JSON on
// standard input (DIR holds node_modules/@huggingface/jinja) and prints the rendering.
const fs = require('fs');
const path = require('path');
const input = JSON.parse(fs.readFileSync(0, 'utf8'));
const { Template } = require(path.join(input.npm, 'node_modules', '@huggingface', 'jinja'));
process.stdout.write(new Template(input.template).render(input.vars));
